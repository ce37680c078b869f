"""When a loader's workers die or the channel that brings their batches breaks: one clear line.

torch's DataLoader notices a dead worker itself, but says so in a traceback ("DataLoader worker
(pid 1234) is killed by signal: Killed", "Too many open files. Communication with the workers is
no longer possible"). `explain` turns those into a LoaderFailure that says what happened and what
to do. Pipelines that do not watch their own workers (torchdata.nodes) are watched by
`loaders.nodes`, which raises the same kind of error.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import signal
import threading
from typing import Any

from torch.utils.data._utils import signal_handling

from facebench.errors import LoaderFailure
from facebench.host import cgroups, shared_memory

_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: (.+?)\.")
_EXITED = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) exited unexpectedly")


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def descriptors_left() -> int:
    """How many more files or sockets this process may open now: a new descriptor takes the
    lowest free number, and fails (EMFILE) where none below the soft limit is free."""
    limit = open_files_limit()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError as error:
        if error.errno == errno.EMFILE:
            return 0
        raise
    held = sum(1 for name in names if int(name) < limit) - 1  # less the listing's own
    return limit - held


def too_many_open_files(loader: str) -> LoaderFailure:
    return LoaderFailure(
        f"loader={loader}: ran out of open files (this process may hold {open_files_limit()} at "
        "once; `ulimit -n` shows the limit). Raise it in this shell, e.g. `ulimit -n 65536`, "
        "or use fewer n_workers"
    )


_OOM_HINT = (
    "usually the kernel's out-of-memory killer (see `dmesg`): use fewer n_workers or a smaller "
    "batch_size"
)
_UNKNOWN_HINT = (
    "it may have been killed (the kernel's out-of-memory killer: see `dmesg`) or crashed; use "
    "fewer n_workers, or run with n_workers=0 to see any error in this process"
)


# The OOM kills this process's memory cgroup had counted when the loader's workers started.
_oom_kills_before = 0


def count_oom_kills_from_now() -> None:
    """Called before a loader's workers start: a worker's death is then put down to the OOM
    killer only if its cgroup counts a kill since (not one from an earlier run)."""
    global _oom_kills_before
    _oom_kills_before = cgroups.oom_kills()


def worker_died(loader: str, pid: int | str, how: str) -> LoaderFailure:
    hint = _OOM_HINT if "SIGKILL" in how or "Killed" in how else _UNKNOWN_HINT
    kills = cgroups.oom_kills() - _oom_kills_before
    limit = cgroups.tightest_memory() if kills > 0 else None
    if limit is not None:
        # In a container dmesg is often out of reach, and DataLoader may only say "exited
        # unexpectedly"; the cgroup counts the kills itself.
        hint = (
            f"the out-of-memory killer killed {kills} process(es) of this memory cgroup (limit "
            f"{limit.limit / 2**30:.1f} GiB at {limit.path}) since the workers started: use "
            "fewer n_workers or a smaller batch_size, or raise the limit (docker run --memory, "
            "a pod's limits.memory, SLURM's --mem)"
        )
    return LoaderFailure(f"loader={loader}: a worker process (pid {pid}) died: {how}; {hint}")


def signal_name(code: int) -> str:
    """A process exit code as Python reports it (-N for signal N) -> 'killed by SIGKILL'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


# How running out of descriptors reads where no errno is left: Python's "Too many open files",
# a descriptor passed over a socket cut off ("received malformed or improperly-truncated
# ancillary data": multiprocessing's resource sharer), torch's own words when dup() fails.
_DESCRIPTOR_WORDS = (
    "Too many open files",
    "ancillary data",
    "ancdata",
    "could not duplicate a shared memory file descriptor",
)


def out_of_descriptors(error: BaseException) -> bool:
    """Whether an error, or one it was raised from, says this process ran out of file
    descriptors: EMFILE or ENFILE, or the words their reporters use (they raise RuntimeError
    from a collector thread, a queue's feeder, a tensor's receipt)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
            return True
        if any(words in str(error) for words in _DESCRIPTOR_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False


def explain(error: BaseException, loader: str) -> LoaderFailure | None:
    """The one-line error for a known worker or channel failure; None for anything else."""
    if out_of_descriptors(error):
        return too_many_open_files(loader)
    if isinstance(error, (EOFError, ConnectionError)):
        # The pipe from the workers closed mid-batch: the writing worker is gone.
        return LoaderFailure(
            f"loader={loader}: the connection to its worker processes broke "
            f"({type(error).__name__}); a worker died: {_UNKNOWN_HINT}"
        )
    if isinstance(error, OSError) and error.errno == errno.ENOSPC and shared_memory.full():
        # The queues' semaphores, made in /dev/shm as an epoch's workers start.
        return shared_memory.ran_out(loader)
    if not isinstance(error, RuntimeError):
        return None
    text = str(error)
    if "unable to allocate shared memory" in text:  # torch's words, in a worker's traceback
        return shared_memory.ran_out(loader)
    if killed := _KILLED.search(text):
        return worker_died(loader, killed.group(1), f"killed by signal ({killed.group(2)})")
    if exited := _EXITED.search(text):
        return worker_died(loader, exited.group(1).strip(), "exited unexpectedly")
    return None


def quiet_sigchld() -> Any:
    """Silence SIGCHLD while a failed loader's workers shut down; returns the handler to restore.

    torch's DataLoader handler raises whenever one of its workers has died, also while its
    iterator is being torn down after that very failure has been reported.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    return previous


def restore_sigchld(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGCHLD, previous)


# Where finalizers run besides `__del__`: weakref.finalize and multiprocessing's Finalize.
_FINALIZER_FILES = ("weakref.py", "multiprocessing/util.py")


def inside_finalizer(frame: Any) -> bool:
    """Whether the interrupted code runs inside a finalizer (a `__del__`, a weakref callback),
    where an exception does not propagate: Python prints it as "Exception ignored in ..." with a
    traceback, and carries on."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename.endswith(_FINALIZER_FILES):
            return True
        frame = frame.f_back
    return False


class WorkerDeaths:
    """During an epoch: torch's check of its DataLoader workers on SIGCHLD, raised only where
    the epoch loop will receive it.

    torch's handler raises wherever the main thread happens to be when a worker dies. Inside a
    finalizer (a temporary file's `__del__`, say) the error was printed as a traceback and lost.
    Here such an error is kept and raised by `check()`, which the loop calls after each batch; a
    loop blocked waiting for a batch gets it at once (nothing is being finalized there), or
    from the DataLoader's own check of its workers a few seconds later.
    """

    def __init__(self) -> None:
        self.pending: RuntimeError | None = None
        self._previous: Any = None

    def __enter__(self) -> WorkerDeaths:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only; nothing to guard here
        # torch installs its handler once per process, when a first DataLoader starts workers:
        # installed now, it sits beneath this one rather than above it.
        signal_handling._set_SIGCHLD_handler()
        self._previous = signal.getsignal(signal.SIGCHLD)
        signal.signal(signal.SIGCHLD, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGCHLD, self._previous)
            self._previous = None

    def _handler(self, signum: int, frame: Any) -> None:
        if not callable(self._previous):
            return
        try:
            self._previous(signum, frame)
        except RuntimeError as error:
            if not inside_finalizer(frame):
                raise
            self.pending = self.pending or error

    def check(self) -> None:
        """Raise a worker's death noticed where it could not be raised."""
        if self.pending is not None:
            error, self.pending = self.pending, None
            raise error
