"""The loop's side of the stage times: every moment of an epoch, in the loop's thread, given to
one of wait, handover, finish or step (facebench/stages.py says what each means).

The loop marks where one stage ends and the next begins; the loader's `next` is timed from the
inside, in wall time and in this thread's CPU time. Blocked on a queue or a future, a thread uses
no CPU: the CPU time is the handover (unpickling, receiving shared memory), the rest the wait.
Where the loop's thread assembled the batch itself (n_workers=0), the stages it timed on the
way are taken out of the handover, and stay in the wait: the loop waited for its own loading.
Whatever else passed between two marks while the loop asked for a batch is the host's finishing
where it runs ahead in threads (a CPU device), else the loop's own handling of the batch (with
the GIL held by another of its threads, say).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from facebench.loaders.shared import Batch
from facebench.stages import StageTotals


class LoopTimeline:
    """Main-side stage times of one epoch, into `totals` (seconds)."""

    def __init__(
        self,
        totals: StageTotals,
        started_at: float,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.totals = totals
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._last = started_at
        self._loader_s = 0.0  # wall time inside the loader since the last mark
        self._handover_s = 0.0  # the part of it this thread spent working on its own account
        self._me = (os.getpid(), threading.get_ident())

    def measured(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """The loader's batches, each `next` timed; their worker-side stage times added up."""
        started = self._clock()
        iterator = iter(batches)  # starts the workers (forks them): all of it is wait
        self._loader_s += self._clock() - started
        while True:
            started, cpu_started = self._clock(), self._cpu_clock()
            try:
                batch = next(iterator)
            except StopIteration:
                self._in_loader(started, cpu_started, None)
                return
            self._in_loader(started, cpu_started, batch)
            self.totals.add_batch(batch.stages)
            yield batch

    def _in_loader(self, started: float, cpu_started: float, batch: Batch | None) -> None:
        wall = self._clock() - started
        cpu = self._cpu_clock() - cpu_started
        times = batch.stages if batch is not None else None
        if times is not None and times.producer == self._me:
            cpu -= sum(times.ns) / 1e9  # this thread loaded the batch itself
        self._loader_s += wall
        self._handover_s += min(max(cpu, 0.0), wall)

    def mark(self, stage: str) -> None:
        """The time since the last mark was `stage`."""
        now = self._clock()
        self.totals.main_s[stage] += now - self._last
        self._last = now

    def arrived(self, rest: str) -> None:
        """A batch came out of the loop's feed: the time since the last mark was the loader's
        (wait and handover), and the rest `rest`."""
        self._settle(self._clock(), rest)

    def close(self, ended_at: float, rest: str) -> None:
        """The epoch's clock stopped at `ended_at`: what remains since the last mark is the
        loader's last `next` (its end) and `rest` (the device finishing its queued work)."""
        self._settle(ended_at, rest)

    def _settle(self, now: float, rest: str) -> None:
        elapsed = max(0.0, now - self._last)
        loader = min(self._loader_s, elapsed)
        handover = min(self._handover_s, loader)
        main = self.totals.main_s
        main["wait"] += loader - handover
        main["handover"] += handover
        main[rest] += elapsed - loader
        self._loader_s = self._handover_s = 0.0
        self._last = now


def loop_timeline(
    enabled: bool, totals: StageTotals, started_at: float, clock: Callable[[], float]
) -> LoopTimeline:
    """The epoch's timeline, or, with stage_times=false, one that times nothing."""
    return LoopTimeline(totals, started_at, clock) if enabled else NoTimeline()


class NoTimeline(LoopTimeline):
    """stage_times=false: nothing timed, the loader's batches passed on as they are."""

    def __init__(self) -> None:
        pass

    def measured(self, batches: Iterable[Batch]) -> Iterable[Batch]:
        return batches

    def mark(self, stage: str) -> None:
        pass

    def arrived(self, rest: str) -> None:
        pass

    def close(self, ended_at: float, rest: str) -> None:
        pass
