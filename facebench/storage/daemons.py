"""The local object server's processes: started detached (they outlive the command) or dying
with the process that started them (a test's), told apart from zombies, ended by process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

_STOP_S = 10.0


def _die_with_parent() -> None:
    """In a daemon started for one process's use (a test's): SIGKILL when that process ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def spawn(command: list[str], log_path: Path, detached: bool) -> int:
    """Start a daemon in a session of its own, its output appended to log_path; its pid."""
    with open(log_path, "ab") as output:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal that started it does not stop it
            preexec_fn=None if detached else _die_with_parent,
        )
    return process.pid


def alive(pid: int) -> bool:
    """Whether the process is there and has not exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is gone for every purpose here.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


def end(pids: dict[str, int]) -> None:
    """SIGTERM each daemon's process group; SIGKILL what is left after a grace period."""
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # each daemon leads its own session, workers included
    deadline = time.monotonic() + _STOP_S
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids.values():
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
