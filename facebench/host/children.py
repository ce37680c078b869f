"""Processes facebench starts with exec and ends itself: the object server's daemons, the
distance relay, the reaper of a job's Ray instance, torchrun's launcher of a job's ranks.

    child = spawn(command, log_path=path)     # a group of its own, dies with this process
    ...
    child.end()                               # SIGTERM to its group, SIGKILL after a grace

Each leads a session (and so a process group) of its own: a Ctrl-C in the terminal reaches the
job alone, which ends its children in order, and ending a child's group ends what it started
in it (Swift's workers, for a daemon). A child started for this process's use asks the kernel
for SIGKILL when this process dies (facebench.host.parent_death), so that a job killed outright
leaves none behind. Those that must outlive it do not: the server `start` leaves running, the
reaper whose work begins when a job dies, and a launcher that stops its ranks in order when its
job is gone (parent_death.end_with).

The kernel's signal comes when the *thread* that started the child ends: spawn from a thread
that lives as long as the child is needed (the main thread, as every caller here does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from facebench.host import parent_death

STOP_S = 10.0  # how long a child has to leave after SIGTERM before SIGKILL
_POLL_S = 0.05


class Child:
    """A process started by spawn(): its Popen, waited for with a deadline, ended by group."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Its exit status once it has ended; None if it is still there after timeout_s."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def end(self, grace_s: float = STOP_S) -> int:
        """End its group (end_groups), then reap it; its exit status."""
        end_groups([self.pid], grace_s)
        return self.process.wait()


def spawn(
    command: list[str],
    *,
    log_path: Path | None = None,
    stdin: int | None = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    dies_with_parent: bool = True,
) -> Child:
    """Start `command` in a session of its own; its output appended to log_path (or this
    process's own where there is none); SIGKILLed when this process dies unless told not to."""
    # libc's prctl is looked up here, in the parent: the child, between fork and exec, only
    # calls it (looking a symbol up there could take a lock another thread held at the fork).
    ask = parent_death.death_signal_asker(signal.SIGKILL) if dies_with_parent else None
    with contextlib.ExitStack() as stack:
        output = stack.enter_context(open(log_path, "ab")) if log_path is not None else None
        process = subprocess.Popen(
            command,
            stdin=stdin,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            env=env,
            start_new_session=True,
            preexec_fn=ask,
        )
    return Child(process)


def alive(pid: int) -> bool:
    """Whether the process is there and has not exited (a zombie, exited but not yet reaped by
    its parent, is gone for every purpose here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


def end_groups(pids: Iterable[int], grace_s: float = STOP_S) -> None:
    """SIGTERM the process group each of `pids` leads; SIGKILL the groups of those still there
    after grace_s. For spawn()'s children, or their pids kept in a file (the server's)."""
    leaders = list(pids)
    for pid in leaders:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(pid) for pid in leaders) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for pid in leaders:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
