"""One builder per shard folder at a time, and a lock that ends with the process that holds it.

Sweep jobs, prepare.py beside train.py and the ranks of a torchrun job may all want the same
shards: the first builds them, the others wait here (saying so), then find them up to date.

The lock is a POSIX record lock (`fcntl.lockf`) on `<folder>/.lock`. Unlike `flock`, such a lock
belongs to the process, not to the open file: forked children (the build's worker processes) do
not inherit it, and the kernel drops it the moment its process ends, however it ends. A build that
was killed therefore never blocks the next one; the next one finds the killed builder's process
id still written in the lock file (a clean exit erases it), says that it takes over, and resumes
from the shards already finished. POSIX locks do not tell the threads of one process apart, so
a process-wide lock per folder serializes those too.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from facebench.host.paths import check_writable

log = logging.getLogger(__name__)

LOCK = ".lock"
WAIT_LOG_S = 30  # how often a build that waits for another says so
_POLL_S = 0.5
_in_process: dict[Path, threading.Lock] = {}
_in_process_guard = threading.Lock()


def _thread_lock(folder: Path) -> threading.Lock:
    with _in_process_guard:
        return _in_process.setdefault(folder.resolve(), threading.Lock())


def _try_lock(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _holder(fd: int) -> str:
    """The process id written in the lock file, or '' when none is."""
    text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else ""


def _write_holder(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def _wait(fd: int, folder: Path) -> None:
    """Block until the lock is ours, saying every WAIT_LOG_S seconds whom we wait for."""
    started = time.monotonic()
    said = -WAIT_LOG_S
    while not _try_lock(fd):
        waited = time.monotonic() - started
        if waited - said >= WAIT_LOG_S:
            holder = _holder(fd)
            log.info(
                "waiting for %s building shards in %s to finish (%.0f s so far; lock file %s)",
                f"process {holder}" if holder else "another process",
                folder,
                waited,
                folder / LOCK,
            )
            said = waited
        time.sleep(_POLL_S)


@contextmanager
def building(folder: Path) -> Iterator[None]:
    """Hold the folder's build lock for the duration of the block (waiting for it if need be)."""
    check_writable(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _thread_lock(folder):
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not _try_lock(fd):
                _wait(fd, folder)
            previous = _holder(fd)
            if previous and previous != str(os.getpid()):
                log.warning(
                    "process %s stopped building shards in %s without finishing (it was killed "
                    "or crashed); taking over, reusing the shards it finished",
                    previous,
                    folder,
                )
            _write_holder(fd, f"{os.getpid()}\n")  # who builds, for anyone who waits
            try:
                yield
            finally:
                _write_holder(fd, "")  # a clean end: nobody to take over from
        finally:
            os.close(fd)  # closing it releases the lock
