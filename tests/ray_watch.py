"""The Ray processes one job started, told apart from every other Ray on the machine (another
test's, running beside it), for the tests that check a job's Ray goes with it.

    watch = RayWatch(process)      # a train.py (or script) process, just started
    ...                            # watch.now(): its Ray processes running now
    assert not watch.left()        # once it ended: those still running after a grace

A job's Ray processes are its descendants (the GCS and raylet it started, the workers and agents
they started): noted five times a second while it runs, as facebench's own reaper notes them.
One started in the last moment before the job died is found afterwards by its raylet (Ray's
workers carry RAY_RAYLET_PID) or by the job's session folder, which Ray names after the job's
pid and its own processes' command lines name.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time

import psutil

from facebench.loaders.ray_reaper import is_ray_process, ray_processes_below

_NOTE_S = 0.2


class RayWatch:
    def __init__(self, job: subprocess.Popen) -> None:
        self.job = job
        self.noted: dict[tuple[int, float], psutil.Process] = {}
        self.raylets: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._note, name="ray-watch", daemon=True)
        self._thread.start()

    def _note(self) -> None:
        try:
            root = psutil.Process(self.job.pid)
        except psutil.Error:
            return
        while not self._stop.is_set() and self.job.poll() is None:
            self.now(root)
            self._stop.wait(_NOTE_S)

    def now(self, root: psutil.Process | None = None) -> list[psutil.Process]:
        """The job's Ray processes running now (each noted)."""
        try:
            found = ray_processes_below(root or psutil.Process(self.job.pid))
        except psutil.Error:
            return []
        for process in found:
            with contextlib.suppress(psutil.Error):
                self.noted[(process.pid, process.create_time())] = process
                if process.name() == "raylet":
                    self.raylets.add(str(process.pid))
        return found

    def left(self, timeout: float = 20.0) -> set[int]:
        """Once the job has ended: its Ray processes still running after `timeout`."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + timeout
        while (alive := self._alive()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return alive

    def _alive(self) -> set[int]:
        alive = {process.pid for process in self.noted.values() if _running(process)}
        session = f"_{self.job.pid}/"  # Ray's session_<date>_<time>_<driver pid>/...
        for process in psutil.process_iter(["cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                line = " ".join(process.info["cmdline"] or [])
                raylet = (process.info["environ"] or {}).get("RAY_RAYLET_PID")
                ours = (session in line and "session_" in line) or raylet in self.raylets
                if ours and is_ray_process(process) and _running(process):
                    alive.add(process.pid)
        return alive


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
