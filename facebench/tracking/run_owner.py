"""Which process owns an MLflow run, and closing the runs whose process is gone.

A process killed outright (the kernel's OOM killer in a container at its memory limit, SIGKILL)
never ends its run, which would stay RUNNING forever. Whenever facebench opens a run, it first
closes, as KILLED with an `ended_by` tag, the experiment's RUNNING runs whose owner is certainly
gone; a run it cannot be sure of is left as it is. How it is sure:

- A SQLite store (the default): the owner holds a lock on a file beside the database, from
  before its run opens until after it ends. The kernel drops the lock when the process dies,
  however it dies, and the file is removed once the run has ended. So a run whose lock can be
  taken, or whose file is gone while the run is still RUNNING, has no owner. This holds across
  containers that share the store's folder, whatever their hostnames or process namespaces.
- Any other store (a tracking server): the run names its process (pid, start time, user), the
  kernel's boot and the process namespace. Only a run of this same boot and namespace, and
  of this user, can be looked up (a container with another namespace, or another user's
  processes hidden by /proc's hidepid, cannot), and it is closed only when its process is gone.

Every verdict is checked against the run's status read again just before it is closed: an
owner that ended its run meanwhile has removed its lock file only after ending it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import psutil

from facebench.host import cgroups

log = logging.getLogger(__name__)

LOCK_TAG = "owner_lock"
HOST_TAG = "owner_host"  # for people reading the run; not used to decide
PID_TAG = "owner_pid"
STARTED_TAG = "owner_started"  # the process's start time: a reused pid is not taken for it
USER_TAG = "owner_uid"
BOOT_TAG = "owner_boot"
NAMESPACE_TAG = "owner_pid_namespace"
ENDED_TAG = "ended_by"
# The owner's memory cgroup and the OOM kills it had counted as the run began: the kernel's
# word, later, on whether its OOM killer is what ended the owner.
CGROUP_TAG = "owner_memory_cgroup"
OOM_KILLS_TAG = "owner_oom_kills"
_SAME_START_S = 1.0
GONE = "its process ended without ending the run"
_LOST_STORE = (
    "or it lost the MLflow store mid-run (then `python -m facebench.upload <its output folder>` "
    "puts in what its results.json kept)"
)


class Ownership:
    """This process's claim on the run it is about to open; `release` once the run has ended."""

    def __init__(self, uri: str) -> None:
        self.token = uuid.uuid4().hex
        self._lock: Any = None
        self.path = _lock_folder(uri)
        if self.path is not None:
            self.path = self.path / f"{self.token}.lock"
            try:
                self.path.parent.mkdir(exist_ok=True)
                self._lock = open(self.path, "w")  # noqa: SIM115 (held for the run's life)
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:  # a read-only folder: the tags below decide instead
                log.debug("no owner lock at %s (%s)", self.path, error)
                self._close()

    def tags(self) -> dict[str, str]:
        tags = {
            HOST_TAG: socket.gethostname(),
            PID_TAG: str(os.getpid()),
            STARTED_TAG: f"{psutil.Process().create_time():.2f}",
            USER_TAG: str(os.getuid()),
            BOOT_TAG: _boot_id(),
            NAMESPACE_TAG: _pid_namespace(),
            CGROUP_TAG: cgroups.memory_cgroup(),
            OOM_KILLS_TAG: str(cgroups.oom_kills()),
        }
        if self._lock is not None:
            tags[LOCK_TAG] = self.token
        return {key: value for key, value in tags.items() if value}

    def release(self) -> None:
        """After the run has ended: the file first, then the lock (see the module's note)."""
        if self._lock is not None and self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
        self._close()

    def _close(self) -> None:
        if self._lock is not None:
            self._lock.close()
        self._lock = None


def close_orphans(client: Any, experiment_id: str, uri: str) -> list[str]:
    """Mark KILLED the experiment's RUNNING runs whose owner is gone; their names."""
    runs = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'")
    folder = _lock_folder(uri)
    closed = []
    for run in runs:
        with _owner_gone(run.data.tags, folder) as gone:
            if not gone or client.get_run(run.info.run_id).info.status != "RUNNING":
                continue
            why = ended_by(run.data.tags)
            client.set_tag(run.info.run_id, ENDED_TAG, why)
            client.set_terminated(run.info.run_id, status="KILLED")
        closed.append(run.info.run_name)
        log.warning("run %s was still RUNNING, but %s: marked KILLED", run.info.run_name, why)
    return closed


def ended_by(tags: dict[str, str]) -> str:
    """Why a run's owner is gone, as far as the kernel says: the OOM killer only where the
    owner's memory cgroup (this process's too, so it can be read) counted a kill since the run
    began."""
    try:
        before = int(tags[OOM_KILLS_TAG])
    except (KeyError, ValueError):
        before = None
    if before is None or not tags.get(CGROUP_TAG) or tags[CGROUP_TAG] != cgroups.memory_cgroup():
        return (
            f"{GONE}: it was killed outright (SIGKILL, or the kernel's OOM killer: `dmesg` on its "
            f"machine says which), or it crashed, {_LOST_STORE}"
        )
    kills = cgroups.oom_kills() - before
    if kills > 0:
        return (
            f"{GONE}: the kernel's OOM killer killed {kills} process(es) of its memory cgroup "
            f"({tags[CGROUP_TAG]}) since the run began, most likely this one; use fewer "
            "n_workers or a smaller batch_size, or raise the memory limit"
        )
    return (
        f"{GONE}, and the kernel's OOM killer killed nothing in its memory cgroup meanwhile: it "
        f"was killed (SIGKILL) or crashed, {_LOST_STORE}"
    )


@contextlib.contextmanager
def _owner_gone(tags: dict[str, str], folder: Path | None):
    """Whether the run's owner is certainly gone; a lock taken to find out is held (so no one
    else acts on the run meanwhile) and its file removed once the run has been dealt with."""
    token = tags.get(LOCK_TAG)
    if token is None or folder is None:
        yield _process_gone(tags)
        return
    path = folder / f"{token}.lock"
    try:
        lock = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:  # removed by its owner, which ended the run first if it could
        yield True
        return
    except OSError:
        yield False
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner runs
            yield False
            return
        yield True
        with contextlib.suppress(OSError):
            path.unlink()


def _process_gone(tags: dict[str, str]) -> bool:
    try:
        pid, started = int(tags[PID_TAG]), float(tags[STARTED_TAG])
        uid, boot, namespace = int(tags[USER_TAG]), tags[BOOT_TAG], tags[NAMESPACE_TAG]
    except (KeyError, ValueError):  # a run facebench did not open, or opened before these tags
        return False
    if (uid, boot, namespace) != (os.getuid(), _boot_id(), _pid_namespace()) or not boot:
        return False  # its process cannot be seen from here
    try:
        process = psutil.Process(pid)
        return (
            abs(process.create_time() - started) >= _SAME_START_S
            or process.status() == psutil.STATUS_ZOMBIE
        )
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _lock_folder(uri: str) -> Path | None:
    """Where a SQLite store's owners keep their locks: a folder beside the database."""
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri.removeprefix("sqlite:///"))
    return database.with_name(database.name + "-owners")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
