"""The stages an image's time is given to, what one batch carries of them (StageTimes), what an
epoch adds up (StageTotals), the stage_* metrics that gives, and how those are read: the costliest
stage, the log line. facebench/stages.py takes the times where the work runs; this module is the
record and its arithmetic, apart so that the arithmetic can be read (and tested) without the
per-thread clocks.

Worker side, wherever a loader does its work:

    read       getting the bytes: open and read a file, a tar stream, a shard (and its check)
    decode     bytes -> pixels: JPEG/PNG decoding, unpickling decoded images
    load       a custom loader's own sample code (loader=custom): its dataset's `__getitem__`
               or `__next__` outside its transforms, reading and decoding in calls of the
               user's that facebench cannot split (facebench/custom/probes.py)
    transform  resize, crop, to-tensor, normalize, on the host (a custom loader's transforms,
               each also under its own class name: `parts`)
    collate    assembling the batch

each in wall-clock and in CPU time. Summed over every batch the loop received, the stages' CPU
time is the part of the workers' CPU time spent in stages (the rest: start-up, the loader's own
bookkeeping).

Main side, in the loop's thread (facebench/run/epoch.py), from the start of the epoch to its end:

    wait       blocked on the loader (including building it and starting its workers)
    handover   receiving a batch: this thread's CPU time inside the loader's `next` (unpickling,
               mapping shared memory), and the loop's bookkeeping of ids and labels
    finish     the host's or the device's finishing (crop and normalize, the copy to the device)
    step       the model's step (on a GPU, the time to queue it, and the final synchronization)

Every moment of the epoch is given to exactly one of them, so they add up to epoch_time_s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from facebench.fetches import Fetches

WORKER_STAGES = ("read", "decode", "load", "transform", "collate")
READ, DECODE, LOAD, TRANSFORM, COLLATE = range(len(WORKER_STAGES))
# The stages of facebench's own loaders, which every run's line shows; `load` only where a run
# had some (loader=custom).
BUILT_IN_STAGES = ("read", "decode", "transform", "collate")
MAIN_STAGES = ("wait", "handover", "finish", "step")


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
    # Named parts of a stage (a custom loader's transforms, by class name): (name, wall ns)
    # each, their time also counted in their stage.
    parts: tuple[tuple[str, int], ...] = ()


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
    parts: dict[str, int] = field(default_factory=dict)  # name: wall ns
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
        for name, ns in times.parts:
            self.parts[name] = self.parts.get(name, 0) + ns

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
            for name, ns in self.parts.items():
                metrics[f"part_{name}_us"] = ns / 1e3 / images
                metrics[f"part_{name}_frac"] = ns / worker_total
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


def shown_stages(metrics: Mapping[str, float]) -> tuple[str, ...]:
    """The worker stages a run's line and tables show: `load` only where it had some."""
    if metrics.get("stage_load_us", 0.0) <= 0:
        return BUILT_IN_STAGES
    # A custom loader's: its own code's stages, and facebench's where it timed some.
    always = ("load", "transform", "collate")
    return tuple(
        name for name in WORKER_STAGES if name in always or metrics.get(f"stage_{name}_us", 0) > 0
    )


def parts(metrics: Mapping[str, float]) -> list[tuple[str, float]]:
    """A run's named parts (a custom loader's transforms) and each one's share of the stages'
    time, costliest first."""
    shares = {
        key.removeprefix("part_").removesuffix("_frac"): value
        for key, value in metrics.items()
        if key.startswith("part_") and key.endswith("_frac")
    }
    return sorted(shares.items(), key=lambda item: -item[1])


def describe(metrics: Mapping[str, float]) -> str | None:
    """One log line: each worker stage's CPU time per image (a custom loader's transforms by
    name), and the wait inside them, then the loop's time."""
    if "stage_main_coverage" not in metrics:
        return None
    loop = ", ".join(f"{name} {metrics[f'stage_{name}_frac']:.0%}" for name in MAIN_STAGES)
    if dominant(metrics) is None:
        return f"stages: workers not broken down; the loop's time: {loop}"
    named = ", ".join(f"{name} {share:.0%}" for name, share in parts(metrics))
    worker = ", ".join(
        f"{name} {metrics.get(f'stage_{name}_cpu_us', 0.0):,.0f} us"
        + (f" ({named} of the stages' time)" if name == "transform" and named else "")
        for name in shown_stages(metrics)
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
