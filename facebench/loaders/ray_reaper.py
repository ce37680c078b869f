"""A local Ray instance ends with its job, however the job ends.

Ray's processes are not the job's forked children (facebench.host.parent_death cannot reach them):
`ray.init()` starts its GCS and raylet with exec, the raylet starts the workers and two agents.
When the job is killed outright (SIGKILL, the OOM killer), the GCS and the raylet go with it,
the workers a moment later, but the dashboard and runtime-env agents linger for a minute, trying
to report the raylet's death to a GCS that is gone.

    reaper = Reaper.start()        # once the local instance is up
    ...
    reaper.release()               # after ray.shutdown(): what is left of the instance goes

The reaper is a small process of its own. It holds the read end of a pipe whose write end only
the job holds, and notes the job's Ray processes (and all they started) twice a second; when the
pipe closes (the job released it, or died), it kills those still running, then leaves.

    python -m facebench.loaders.ray_reaper JOB_PID     # run by Reaper.start, not by hand
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys

import psutil

from facebench.host.children import Child, spawn
from facebench.host.paths import PROJECT_ROOT

_NOTE_S = 0.5
_RELEASE_TIMEOUT_S = 10.0


class Reaper:
    """The reaper process of this job's local Ray instance."""

    def __init__(self, child: Child) -> None:
        self.child = child

    @classmethod
    def start(cls) -> Reaper:
        command = [sys.executable, "-m", __name__, str(psutil.Process().pid)]
        # facebench importable as it is here, installed or run from a checkout.
        path = [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        # Not dying with the job: its work begins when the job dies.
        return cls(spawn(command, stdin=subprocess.PIPE, env=env, dies_with_parent=False))

    def release(self) -> None:
        """Close the pipe: the reaper kills what is left of the instance, and ends."""
        if self.child.process.stdin is not None:
            self.child.process.stdin.close()
        if self.child.wait(_RELEASE_TIMEOUT_S) is None:
            self.child.end()


def ray_processes_below(job: psutil.Process) -> list[psutil.Process]:
    """The job's Ray processes (GCS, raylet, Ray's own Python services) and every process they
    started (workers, agents); not the job's other children (a DataLoader's workers)."""
    found: dict[int, psutil.Process] = {}
    for child in job.children():
        with contextlib.suppress(psutil.Error):
            if is_ray_process(child):
                found[child.pid] = child
                found.update((grand.pid, grand) for grand in child.children(recursive=True))
    return list(found.values())


def is_ray_process(process: psutil.Process) -> bool:
    """Ray's GCS or raylet, a process Ray names ray::... (workers, agents), or one of Ray's own
    Python services (its dashboard, monitors, a worker starting)."""
    line = process.cmdline()
    first = line[0] if line else ""
    return (
        process.name() in ("gcs_server", "raylet")
        or first.startswith("ray::")
        or any("/site-packages/ray/" in part for part in line[:3])
    )


# Ray's session folder, which its processes' command lines name (session_<date>_<time>_<pid>).
_SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_[\d-]+_\d+")


def _reap(noted: dict[tuple[int, float], psutil.Process], sessions: set[str]) -> None:
    """Kill the noted processes still running, and any other of the same Ray session (a
    worker the raylet was starting as the job died, never noted, now adopted by init); then
    wait a little for them to go. psutil checks each one's start time: a pid reused since is
    never killed."""
    doomed = list(noted.values())
    if sessions:
        for process in psutil.process_iter(["cmdline"]):
            line = " ".join(process.info["cmdline"] or [])
            if any(session in line for session in sessions) and process.pid != os.getpid():
                doomed.append(process)
    alive = []
    for process in doomed:
        with contextlib.suppress(psutil.Error):
            process.kill()
            alive.append(process)
    psutil.wait_procs(alive, timeout=5)


def main(job_pid: int) -> None:
    noted: dict[tuple[int, float], psutil.Process] = {}
    sessions: set[str] = set()
    try:
        job = psutil.Process(job_pid)
    except psutil.Error:
        return
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], _NOTE_S)
        if readable and not sys.stdin.buffer.read1(1):  # the pipe closed: the job is done
            break
        with contextlib.suppress(psutil.Error):
            for process in ray_processes_below(job):
                with contextlib.suppress(psutil.Error):
                    key = (process.pid, process.create_time())
                    if key not in noted:  # a new one: the session its command line names
                        sessions.update(_SESSION.findall(" ".join(process.cmdline())))
                        noted[key] = process
    _reap(noted, sessions)


if __name__ == "__main__":
    main(int(sys.argv[1]))
