"""Where each image's time goes: stage times, measured in every thread and process that works on
a batch, carried to the loop with the batch itself.

Worker side, wherever a loader does its work (DataLoader worker processes, loader threads,
torchdata.nodes workers, LitData's workers, or the loop's own thread with n_workers=0):

    read       getting the bytes: open and read a file, a tar stream, a shard (and its check)
    decode     bytes -> pixels: JPEG/PNG decoding, unpickling decoded images
    transform  resize, crop, to-tensor, normalize, on the host
    collate    assembling the batch

Each is timed twice: in wall-clock time (`perf_counter_ns`) and in the CPU time of the thread
doing it (`thread_time_ns`); the two readings cost about 0.3 us. CPU time is what a stage
costs; wall time beyond it is time the stage waited inside: for a core (more workers than
cores, or other work on the machine) or for storage. With 5 workers on 2 cores a stage's wall
time is mostly waiting, so CPU time is what tells loaders apart, and is what the log, the report
and advise speak of first. Both are added to a tally of the thread doing the work: no lock, no
shared counter. When a batch is assembled, `take` empties the tally of the thread that assembled
it into a `StageTimes` that travels inside the Batch (a few numbers, pickled with it), together
with the CPU time its producer used since its previous batch: the whole process's for a worker
process (it started at 0 when the process was forked), the thread's own in the main process.
Work done before the first batch (a DataPipe's listing, say) lands in the first batch's share; a
stage that works for several batches at once (a pickle shard's read) lands in the batch that
follows it. Summed over every batch the loop received, the stages' CPU time is the part of the
workers' CPU time spent in stages (the rest: start-up, the loader's own bookkeeping).

Main side, in the loop's thread (facebench/run/epoch.py), from the start of the epoch to its end:

    wait       blocked on the loader (including building it and starting its workers)
    handover   receiving a batch: this thread's CPU time inside the loader's `next` (unpickling,
               mapping shared memory), and the loop's bookkeeping of ids and labels
    finish     the host's or the device's finishing (crop and normalize, the copy to the device)
    step       the model's step (on a GPU, the time to queue it, and the final synchronization)

Every moment of the epoch is given to exactly one of them, so they add up to epoch_time_s.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from facebench.fetches import Fetches

WORKER_STAGES = ("read", "decode", "transform", "collate")
READ, DECODE, TRANSFORM, COLLATE = range(len(WORKER_STAGES))
MAIN_STAGES = ("wait", "handover", "finish", "step")

T = TypeVar("T")
Mark = tuple[int, int]  # a moment: (wall-clock ns, this thread's CPU ns)
_OFF: Mark = (0, 0)


def now() -> Mark:
    """The moment a stage starts, for `lap` (two clock readings; none when timing is off)."""
    return (time.perf_counter_ns(), time.thread_time_ns()) if _enabled else _OFF


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One batch's worker-side stage times (ns): wall clock and the threads' CPU time; what its
    producer used in CPU time since its previous batch (ns); who produced it (pid, thread id)."""

    ns: tuple[int, ...]
    stage_cpu_ns: tuple[int, ...]
    cpu_ns: int
    producer: tuple[int, int]
    # Images decoded by PIL because the chosen fast decoder could not give PIL's pixels.
    fallbacks: int = 0
    # What reading from an object store cost (facebench/fetches.py); None: nothing fetched.
    fetches: Fetches | None = None


class _Tally:
    __slots__ = ("ns", "stage_cpu", "cpu_mark", "fallbacks", "fetches")

    def __init__(self, cpu_mark: int) -> None:
        self.ns = [0] * len(WORKER_STAGES)
        self.stage_cpu = [0] * len(WORKER_STAGES)
        self.cpu_mark = cpu_mark
        self.fallbacks = 0
        self.fetches: Fetches | None = None


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


def lap(stage: int, since: Mark) -> Mark:
    """Add the time since `since` (a `now()` or `lap()` reading of this thread) to `stage`;
    return the moment now, where the next stage starts."""
    if not _enabled:
        return _OFF
    t = (time.perf_counter_ns(), time.thread_time_ns())
    tally = _tally()
    tally.ns[stage] += t[0] - since[0]
    tally.stage_cpu[stage] += max(0, t[1] - since[1])
    return t


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
    )
    tally.fallbacks = 0
    tally.fetches = None
    tally.ns = [0] * len(WORKER_STAGES)
    tally.stage_cpu = [0] * len(WORKER_STAGES)
    tally.cpu_mark = cpu
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


@dataclass
class StageTotals:
    """What the loop adds up over an epoch: the worker side from the batches' StageTimes, the
    main side from the loop's own clock (seconds)."""

    worker_ns: list[int] = field(default_factory=lambda: [0] * len(WORKER_STAGES))
    stage_cpu_ns: list[int] = field(default_factory=lambda: [0] * len(WORKER_STAGES))
    worker_cpu_ns: int = 0
    timed_batches: int = 0
    fallbacks: int = 0
    fetches: Fetches = field(default_factory=Fetches)
    main_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MAIN_STAGES, 0.0))
    enabled: bool = True  # False: stage_times=false, nothing to report

    def add_batch(self, times: StageTimes | None) -> None:
        if times is None:
            return
        for index, (ns, cpu) in enumerate(zip(times.ns, times.stage_cpu_ns, strict=True)):
            self.worker_ns[index] += ns
            self.stage_cpu_ns[index] += cpu
        self.worker_cpu_ns += times.cpu_ns
        self.timed_batches += 1
        self.fallbacks += times.fallbacks
        if times.fetches is not None:
            self.fetches.add(times.fetches)

    def metrics(self, images: int, epoch_time_s: float) -> dict[str, float]:
        """Per image, for every worker stage: stage_<name>_cpu_us (CPU time) and its share of
        the stages' CPU time (stage_<name>_cpu_frac), stage_<name>_us (wall time) and its share
        (stage_<name>_frac); stage_waited_us, wall time in stages beyond their CPU time. The
        worker side only where batches carried stage times (a loader that has none is not
        broken down). For the loop's stages, wall time and its share of the epoch."""
        if not self.enabled or images <= 0 or epoch_time_s <= 0:
            return {}
        metrics: dict[str, float] = {}
        worker_total, cpu_total = sum(self.worker_ns), sum(self.stage_cpu_ns)
        if self.timed_batches and worker_total > 0:
            for name, ns, cpu in zip(WORKER_STAGES, self.worker_ns, self.stage_cpu_ns, strict=True):
                metrics[f"stage_{name}_us"] = ns / 1e3 / images
                metrics[f"stage_{name}_frac"] = ns / worker_total
                metrics[f"stage_{name}_cpu_us"] = cpu / 1e3 / images
                if cpu_total > 0:
                    metrics[f"stage_{name}_cpu_frac"] = cpu / cpu_total
            metrics["stage_worker_us"] = worker_total / 1e3 / images
            metrics["stage_waited_us"] = max(0, worker_total - cpu_total) / 1e3 / images
            metrics["stage_worker_cpu_us"] = self.worker_cpu_ns / 1e3 / images
            if self.worker_cpu_ns > 0:
                metrics["stage_worker_coverage"] = worker_total / self.worker_cpu_ns
            metrics["decode_fallbacks"] = float(self.fallbacks)
        for name, seconds in self.main_s.items():
            metrics[f"stage_{name}_us"] = seconds * 1e6 / images
            metrics[f"stage_{name}_frac"] = seconds / epoch_time_s
        metrics["stage_main_coverage"] = sum(self.main_s.values()) / epoch_time_s
        metrics.update(self.fetches.metrics(epoch_time_s))
        return metrics


def dominant(metrics: Mapping[str, float]) -> str | None:
    """The worker stage that costs most CPU time per image (wall time, from runs that did not
    measure CPU time), or None where there is no breakdown."""
    kind = "cpu_frac" if any(f"stage_{n}_cpu_frac" in metrics for n in WORKER_STAGES) else "frac"
    shares = {name: metrics.get(f"stage_{name}_{kind}") for name in WORKER_STAGES}
    known = {name: share for name, share in shares.items() if share is not None}
    return max(known, key=known.__getitem__) if known else None


def dominant_label(metrics: Mapping[str, float]) -> str | None:
    """The costliest worker stage and its share of the stages' CPU time, as "decode 53%"."""
    name = dominant(metrics)
    if name is None:
        return None
    share = metrics.get(f"stage_{name}_cpu_frac", metrics[f"stage_{name}_frac"])
    return f"{name} {share:.0%}"


def describe(metrics: Mapping[str, float]) -> str | None:
    """One log line: each worker stage's CPU time per image, and the wait inside them, then
    the loop's time."""
    if "stage_main_coverage" not in metrics:
        return None
    loop = ", ".join(f"{name} {metrics[f'stage_{name}_frac']:.0%}" for name in MAIN_STAGES)
    if dominant(metrics) is None:
        return f"stages: workers not broken down; the loop's time: {loop}"
    worker = ", ".join(
        f"{name} {metrics.get(f'stage_{name}_cpu_us', 0.0):,.0f} us" for name in WORKER_STAGES
    )
    cpu = metrics.get("stage_worker_cpu_us", 0.0)
    waited = metrics.get("stage_waited_us", 0.0)
    fallbacks = int(metrics.get("decode_fallbacks", 0))
    fell_back = f"; {fallbacks:,} images decoded by PIL instead (fallbacks)" if fallbacks else ""
    return (
        f"stages per image, CPU time summed over workers: {worker} (the workers' CPU time "
        f"{cpu:,.0f} us); inside them, waiting for a core or storage: {waited:,.0f} us; "
        f"the loop's time: {loop}{fell_back}"
    )
