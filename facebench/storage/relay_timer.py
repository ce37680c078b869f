"""The relay's moments, kept to tens of microseconds rather than asyncio's millisecond.

asyncio's event loop waits in epoll, whose timeout is whole milliseconds rounded up: a first byte
due at 20.3 ms left at 21 ms, half a millisecond late on average at every distance, a tenth of a
5 ms bucket's latency (measured on sequential GETs: 0.56-0.95 ms after its moment, 0.19-0.26 ms
with this timer). So the loop sleeps in epoll only to within a couple of milliseconds of a first
byte's moment, and one thread, which sleeps on a condition with a timeout of nanoseconds'
resolution (and, under the relay's real-time scheduling, no timer slack), wakes the loop at the
moment itself through its thread-safe handoff. Bodies are paced by asyncio alone: their token
bucket makes a late wake-up up on the next chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time

# Within this of a moment the loop stops waiting in epoll (whole milliseconds, rounded up).
_EPOLL_SLACK_S = 0.002


class _Waker:
    """The thread that wakes each waiter's future at its moment, in the waiter's own loop."""

    def __init__(self) -> None:
        self.due: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.changed = threading.Condition()
        self.order = itertools.count()  # ties broken by arrival: futures do not compare
        self.thread: threading.Thread | None = None

    def at(self, moment: float) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.changed:
            heapq.heappush(self.due, (moment, next(self.order), loop, future))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="relay-timer", daemon=True)
                self.thread.start()
            self.changed.notify()
        return future

    def _run(self) -> None:
        with self.changed:
            while True:
                if not self.due:
                    self.changed.wait()
                    continue
                left = self.due[0][0] - time.monotonic()
                if left > 0:
                    self.changed.wait(left)
                    continue
                # Every waiter due by now, in one pass (never one before its moment: a first
                # byte sooner than the latency would be a bucket nearer than emulated).
                while self.due and self.due[0][0] <= time.monotonic():
                    _, _, loop, future = heapq.heappop(self.due)
                    with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                        loop.call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future) -> None:
    if not future.done():  # a waiter cancelled (its connection gone) has nothing to wake
        future.set_result(None)


_waker = _Waker()


async def until(moment: float) -> None:
    """Return at `moment` (time.monotonic()'s clock), not a millisecond after."""
    wait = moment - time.monotonic()
    if wait > _EPOLL_SLACK_S:
        await asyncio.sleep(wait - _EPOLL_SLACK_S)
    if moment > time.monotonic():
        await _waker.at(moment)
