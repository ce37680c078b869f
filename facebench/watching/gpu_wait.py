"""How long the GPU waited for data in a user's loop, from CUDA events: one recorded on the
current stream as a batch is handed over, one as the loop asks for the next.

The GPU reaches a request's event once it has run the step queued before it; it reaches the next
hand-over's only once the host had that batch. The time between the two, on the GPU's own clock,
is the time it had nothing to do but wait for data (none where the host queued the next batch
before the GPU finished the last step); the time from a hand-over to the next request is the
step's. Nothing waits for an event inside the loop: completed pairs are read when many have
accumulated (`query` does not synchronize), the rest once the epoch's clock has stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Events kept before the completed ones are read and let go (two a batch).
_FOLD_EVERY = 512


class GpuWait:
    """The epoch's events, in order: start, then (hand-over, request) for each batch, then end.
    `enabled=False` (no CUDA in use) records nothing."""

    def __init__(self, enabled: bool, new_event: Callable[[], Any] | None = None) -> None:
        self.enabled = enabled
        self._new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._events: list[Any] = []
        self._waited_ms = 0.0  # request (or start) to hand-over, folded so far
        self._busy_ms = 0.0  # hand-over to request
        self._first: Any = None
        self._wait_next = True  # the span from the first kept event is a wait

    def _record(self) -> None:
        event = self._new_event()
        event.record()
        self._events.append(event)

    def start(self) -> None:
        if self.enabled:
            self._record()
            self._first = self._events[0]

    def handover(self) -> None:
        if self.enabled:
            self._record()

    def request(self) -> None:
        if self.enabled:
            self._record()
            if len(self._events) >= _FOLD_EVERY and self._events[-1].query():
                self._fold()

    def _fold(self) -> None:
        """The spans between completed events added up, alternately a wait and a step; the
        last event kept as the next span's start."""
        events, wait = self._events, self._wait_next
        for earlier, later in zip(events, events[1:], strict=False):
            span = earlier.elapsed_time(later)
            if wait:
                self._waited_ms += span
            else:
                self._busy_ms += span
            wait = not wait
        self._events, self._wait_next = [events[-1]], wait

    def stop(self) -> None:
        """The epoch's end: after the last request, the loader's end was a wait too."""
        if self.enabled and self._first is not None:
            self._record()

    def metrics(self) -> dict[str, float]:
        """After `stop`, once the device has been synchronized (the epoch's clock stopped): the
        GPU's time waiting for data and stepping, as gpu_data_wait_s and gpu_busy_s and their
        shares."""
        if not self.enabled or self._first is None:
            return {}
        self._events[-1].synchronize()
        self._fold()
        total_ms = self._first.elapsed_time(self._events[-1])
        if total_ms <= 0:
            return {}
        waited, busy = self._waited_ms / 1000, self._busy_ms / 1000
        return {
            "gpu_data_wait_s": waited,
            "gpu_data_wait_frac": min(1.0, waited / (total_ms / 1000)),
            "gpu_busy_s": busy,
            "gpu_busy_frac": min(1.0, busy / (total_ms / 1000)),
            "gpu_idle_s": max(0.0, total_ms / 1000 - busy),
        }
