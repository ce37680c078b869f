"""How a watched loop ended, and so the status of its run: the loader exhausted or the loop left
by a `break` (FINISHED, with what it saw), by the user's exception (FAILED), by Ctrl-C (KILLED).

A `for` loop that stops early closes its iterator, and Python tells the iterator nothing more:
whether a `break` or an exception left the loop is read from the loop's frame, whose last
instruction is the one that let the iterator go (POP_TOP after a `break` or a `return` in the
loop; a name rebound) and the one that raised otherwise. Ctrl-C is told apart from other
exceptions by the SIGINT that came just before, noted by a handler that then does what the one
it replaced did. `with watch(...)` hands the exception to `__exit__` and needs neither: it is
exact where the iterator is kept and let go elsewhere (a function that returns with it).
"""

from __future__ import annotations

import dis
import inspect
import signal
import sys
import threading
import time
from enum import Enum
from types import FrameType
from typing import Any

# Where the iterator was let go without an exception: the loop popped it (a break, a return),
# a function returned, a name was rebound or deleted.
_LET_GO = {
    "POP_TOP",
    "RETURN_VALUE",
    "STORE_FAST",
    "STORE_NAME",
    "STORE_GLOBAL",
    "DELETE_FAST",
    "DELETE_NAME",
    "DELETE_GLOBAL",
}
_FRAMES_LOOKED_AT = 4
# A SIGINT this recent is what raised in the loop (KeyboardInterrupt as it arrives).
_SIGINT_WITHIN_S = 5.0


class Ending(Enum):
    EXHAUSTED = "exhausted"
    LEFT = "left"  # a break or a return: what was seen is what the run measured
    CLOSED = "closed"  # watch.close()
    FAILED = "failed"
    KILLED = "killed"

    @property
    def status(self) -> str:
        """The MLflow run's status."""
        return self.name if self in (Ending.FAILED, Ending.KILLED) else "FINISHED"

    @property
    def said(self) -> str:
        return _SAID[self]


_SAID = {
    Ending.EXHAUSTED: "the loader ran out",
    Ending.LEFT: "the loop was left (break)",
    Ending.CLOSED: "watch was closed",
    Ending.FAILED: "the loop raised",
    Ending.KILLED: "interrupted (Ctrl-C)",
}


def of_error(error: BaseException | None) -> Ending:
    """The ending an exception gives, or, None, the loop's leaving by a break."""
    if error is None:
        return Ending.LEFT
    return Ending.KILLED if isinstance(error, KeyboardInterrupt) else Ending.FAILED


def of_closed_loop(frame: FrameType | None, interrupts: Interrupts) -> Ending:
    """The ending of a loop that closed its iterator early, from the frame that closed it: a
    generator that wraps the iterator (tqdm's), closing as it is let go, passes the question to
    the frame that let it go."""
    if interrupts.recent():
        return Ending.KILLED
    for _ in range(_FRAMES_LOOKED_AT):
        if frame is None:
            break
        try:
            name = dis.opname[frame.f_code.co_code[frame.f_lasti]]
        except (AttributeError, IndexError):  # not CPython's frames: said as a break
            return Ending.LEFT
        if name in _LET_GO:
            return Ending.LEFT
        if not frame.f_code.co_flags & inspect.CO_GENERATOR:
            return Ending.FAILED  # the instruction that raised
        frame = frame.f_back
    return Ending.LEFT


class Interrupts:
    """Notes each SIGINT while any loop is watched, then hands it to the handler it replaced
    (Python's own raises KeyboardInterrupt): the user's script behaves as without it. One for
    the process (INTERRUPTS), installed while at least one watch is iterated, so that watches
    that end in any order put the script's handler back."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._at = 0.0
        self._users = 0
        self._installed = False

    def install(self) -> None:
        self._users += 1
        if self._users == 1:  # a SIGINT from before any of the watches now begun is not theirs
            self._at = 0.0
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):  # ignored, or the default action: nothing to pass on to
            return
        self._previous = previous
        signal.signal(signal.SIGINT, self._noted)
        self._installed = True

    def _noted(self, signum: int, frame: FrameType | None) -> Any:
        self._at = time.monotonic()
        return self._previous(signum, frame)

    def recent(self) -> bool:
        return self._at > 0 and time.monotonic() - self._at < _SIGINT_WITHIN_S

    def uninstall(self) -> None:
        """Once no watch is iterated: the replaced handler back, unless the script has set
        another meanwhile."""
        self._users = max(0, self._users - 1)
        if self._users or not self._installed:
            return
        self._installed = False
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) == self._noted:
            signal.signal(signal.SIGINT, self._previous)


INTERRUPTS = Interrupts()


def uncaught() -> Ending | None:
    """At exit: the ending an uncaught exception gave the script, if one did."""
    error = getattr(sys, "last_value", None)
    return of_error(error) if error is not None else None
