"""Where each image's time goes: stage times, measured in every thread and process that works on
a batch, carried to the loop with the batch itself.

Worker side, wherever a loader does its work (DataLoader worker processes, loader threads,
torchdata.nodes workers, LitData's workers, or the loop's own thread with n_workers=0), each of
read, decode, transform and collate (facebench/stage_metrics.py says what each holds) is timed
twice: in wall-clock time (`perf_counter_ns`) and in the CPU time of the thread doing it
(`thread_time_ns`); the two readings cost about 0.3 us. CPU time is what a stage costs; wall
time beyond it is time the stage waited inside: for a core (more workers than cores, or other
work on the machine) or for storage. With 5 workers on 2 cores a stage's wall
time is mostly waiting, so CPU time is what tells loaders apart, and is what the log, the report
and advise speak of first. Both are added to a tally of the thread doing the work: no lock, no
shared counter. When a batch is assembled, `take` empties the tally of the thread that assembled
it into a `StageTimes` that travels inside the Batch (a few numbers, pickled with it), together
with the CPU time its producer used since its previous batch: the whole process's for a worker
process (it started at 0 when the process was forked), the thread's own in the main process.
Work done before the first batch (a DataPipe's listing, say) lands in the first batch's share; a
stage that works for several batches at once (a pickle shard's read) lands in the batch that
follows it.

This module holds the clocks and the per-thread tallies; what the times add up to in an epoch,
and the stage_* metrics, are facebench/stage_metrics.py's, whose names are imported from here as
well, so that a loader or the loop needs one module for its stage times.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from facebench.fetches import Fetches
from facebench.stage_metrics import (
    BUILT_IN_STAGES,
    COLLATE,
    DECODE,
    LOAD,
    MAIN_STAGES,
    READ,
    TRANSFORM,
    WORKER_STAGES,
    StageTimes,
    StageTotals,
    describe,
    dominant,
    dominant_label,
    parts,
)

__all__ = [
    "BUILT_IN_STAGES",
    "COLLATE",
    "DECODE",
    "LOAD",
    "MAIN_STAGES",
    "READ",
    "TRANSFORM",
    "WORKER_STAGES",
    "Mark",
    "StageTimes",
    "StageTotals",
    "begin_epoch",
    "describe",
    "dominant",
    "dominant_label",
    "fallback",
    "fetched",
    "lap",
    "part",
    "now",
    "parts",
    "set_timing",
    "spent",
    "take",
    "take_fetches",
    "timed_items",
    "timing",
]

T = TypeVar("T")
Mark = tuple[int, int]  # a moment: (wall-clock ns, this thread's CPU ns)
_OFF: Mark = (0, 0)


def now() -> Mark:
    """The moment a stage starts, for `lap` (two clock readings; none when timing is off)."""
    return (time.perf_counter_ns(), time.thread_time_ns()) if _enabled else _OFF


class _Tally:
    __slots__ = ("ns", "stage_cpu", "cpu_mark", "fallbacks", "fetches", "parts")

    def __init__(self, cpu_mark: int) -> None:
        self.ns = [0] * len(WORKER_STAGES)
        self.stage_cpu = [0] * len(WORKER_STAGES)
        self.cpu_mark = cpu_mark
        self.fallbacks = 0
        self.fetches: Fetches | None = None
        self.parts: dict[str, int] = {}  # name: wall ns


def _in_child() -> bool:
    return multiprocessing.parent_process() is not None


_enabled = True
_local = threading.local()
# A worker process's CPU time is all its own; in the main process, each thread's is.
_cpu_clock: Callable[[], int] = time.process_time_ns if _in_child() else time.thread_time_ns


def _forked() -> None:
    """In a forked child: the parent's tallies are not this process's work."""
    global _local, _cpu_clock
    _local = threading.local()
    _cpu_clock = time.process_time_ns


os.register_at_fork(after_in_child=_forked)


def _tally() -> _Tally:
    try:
        return _local.tally
    except AttributeError:
        # A worker process or thread counts its CPU time from its start: its clock began at 0
        # when it was forked or started (within the epoch). The loop's thread starts its own
        # count as each epoch begins (begin_epoch).
        tally = _local.tally = _Tally(0)
        return tally


def lap(stage: int, since: Mark, less: Mark = _OFF) -> Mark:
    """Add the time since `since` (a `now()` or `lap()` reading of this thread) to `stage`,
    less `less` (time inside it already given to another stage: `spent` before and after);
    return the moment now, where the next stage starts."""
    if not _enabled:
        return _OFF
    t = (time.perf_counter_ns(), time.thread_time_ns())
    tally = _tally()
    tally.ns[stage] += max(0, t[0] - since[0] - less[0])
    tally.stage_cpu[stage] += max(0, t[1] - since[1] - less[1])
    return t


def part(name: str, since_ns: int, until_ns: int = 0) -> int:
    """Add the wall-clock time from `since_ns` to `until_ns` (`time.perf_counter_ns()`
    readings; 0: now) to the part `name` (a step of a custom loader's Compose, by class name),
    which travels with the batch as the stages do; its stage's time is taken around the whole
    (only the wall clock here: the steps are many, and a thread's CPU clock costs a system
    call). The moment it ends."""
    end_ns = until_ns or time.perf_counter_ns()
    if _enabled:
        parts = _tally().parts
        parts[name] = parts.get(name, 0) + end_ns - since_ns
    return end_ns


def spent(stage: int) -> Mark:
    """The wall and CPU time this thread has given `stage` since its last take: read before
    and after a call to tell the time spent inside it from the call's own."""
    if not _enabled:
        return _OFF
    tally = _tally()
    return (tally.ns[stage], tally.stage_cpu[stage])


def fallback() -> None:
    """Count one image that the chosen decoder handed to PIL (decoder=fast: a CMYK JPEG, a
    16-bit PNG); it travels with the batch, as the stage times do."""
    if _enabled:
        _tally().fallbacks += 1


def fetched(size: int, latency_ns: int, first_byte_ns: int, retries: int, throttled: int) -> None:
    """Count one GET from an object store (its bytes, latency, first byte, retried attempts and
    503 answers) for the batch this thread assembles next, as the stage times are."""
    if _enabled:
        tally = _tally()
        if tally.fetches is None:
            tally.fetches = Fetches()
        tally.fetches.add_get(size, latency_ns, first_byte_ns, retries, throttled)


def take() -> StageTimes | None:
    """This thread's stage times since its last take, for the batch it just assembled; None
    when timing is off."""
    if not _enabled:
        return None
    tally = _tally()
    cpu = _cpu_clock()
    times = StageTimes(
        tuple(tally.ns),
        tuple(tally.stage_cpu),
        cpu - tally.cpu_mark,
        (os.getpid(), threading.get_ident()),
        tally.fallbacks,
        tally.fetches,
        tuple(tally.parts.items()),
    )
    _local.tally = _Tally(cpu)  # the next batch's tally, its CPU counted from here
    return times


def take_fetches() -> StageTimes | None:
    """This thread's GETs since its last take, alone, for a loader whose other work runs in a
    library's threads and is not timed (DALI's): no stage times and no CPU are claimed for
    them. None when nothing was fetched or timing is off."""
    if not _enabled:
        return None
    tally = _tally()
    fetches, tally.fetches = tally.fetches, None
    if fetches is None:
        return None
    zeros = (0,) * len(WORKER_STAGES)
    return StageTimes(zeros, zeros, 0, (os.getpid(), threading.get_ident()), 0, fetches)


def begin_epoch(on: bool) -> StageTotals:
    """In the loop's thread, as an epoch starts (before its workers are forked: they inherit
    the setting): timing on or off, this thread's tally forgotten, so that batches it assembles
    itself (n_workers=0) count from here; the totals the loop fills."""
    global _enabled
    _enabled = on
    _local.tally = _Tally(_cpu_clock())
    return StageTotals(enabled=on)


def timing() -> bool:
    """Whether stage times are being taken (stage_times=true), for workers that do not inherit
    this process's setting (Ray's)."""
    return _enabled


def set_timing(on: bool) -> None:
    """In a worker process started on its own (a Ray worker): take stage times, or not, as the
    loop that receives its batches does."""
    global _enabled
    _enabled = on


def timed_items(items: Iterable[T], stage: int = READ) -> Iterator[T]:
    """The items of an iterable; the time it takes to produce each is `stage` (a tar stream's
    samples, a listing's records)."""
    start = now()
    for item in items:
        lap(stage, start)
        yield item
        start = now()
