"""The timed epoch: ask the loader for a batch, finish it on the device, train on it, repeat.

Nothing here reads a value back from the device per batch: losses stay on the device and are read
once, after the clock stops; the GPU's busy time comes from CUDA events read then too.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from facebench import stages
from facebench.data.transforms import ARTICLE, Geometry
from facebench.fetches import Fetches
from facebench.host.progress import epoch_progress
from facebench.host.resources import usable_cores
from facebench.loaders.failures import WorkerDeaths, explain, quiet_sigchld, restore_sigchld
from facebench.loaders.shared import Batch
from facebench.measure.meter import DeviceBusy, EpochMeter, EpochTimes
from facebench.measure.timeline import loop_timeline
from facebench.measure.usage import UsageMonitor
from facebench.run.accelerator import Accelerator, EmulatedSteps
from facebench.run.finish import Finisher, Ready, finished_ahead_on_cpu
from facebench.run.per_batch import BatchUse, Seen
from facebench.run.training import Trainer

_MIN_BATCHES = 3  # a time-limited epoch still measures past its warm-up batch


@dataclass
class EpochResult:
    times: EpochTimes
    resources: dict[str, float]
    order: dict[str, float]
    loss_first: float | None
    loss_last: float | None
    ids: np.ndarray | None = None  # every delivered sample id, in arrival order
    device_busy: dict[str, float] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)  # stage_* (facebench/stages.py)
    emulated: dict[str, float] = field(default_factory=dict)  # au (facebench/run/accelerator.py)
    # What the loader's own library measured of the epoch (Ray Data's statistics: ray_*).
    library: dict[str, float] = field(default_factory=dict)
    # A bucket's GETs as counted (their storage_* metrics are in stages): several ranks'
    # histograms pool into the job's percentiles (host/distributed.whole_job).
    fetches: Fetches | None = None

    def metrics(self) -> dict[str, float]:
        metrics = {
            **self.times.metrics(),
            **self.resources,
            **self.order,
            **self.device_busy,
            **self.stages,
            **self.emulated,
            **self.library,
        }
        if self.loss_first is not None and self.loss_last is not None:
            metrics["loss_first"] = self.loss_first
            metrics["loss_last"] = self.loss_last
        return metrics


@dataclass
class EpochSettings:
    """How one epoch runs, besides the loader and the model."""

    device: torch.device
    max_batches: int = 0  # 0: the whole epoch
    sample_hz: float = 4.0
    label_counts: np.ndarray | None = None  # for batch_label_diversity
    expected_images: int | None = None  # for the progress bar
    description: str = "epoch"
    join: AbstractContextManager | None = None  # DDP's Join, for ranks that finish early
    loader_name: str = "loader"
    # Stop where a GPU run hands the batch over: no copy to the device, no finishing.
    host_only: bool = False
    # Stop once this many seconds have passed (and a few batches are in); 0: no limit.
    time_limit_s: float = 0.0
    # The crop and normalization that finish uint8 batches (transform.*).
    geometry: Geometry = ARTICLE
    # Time each stage of each image (facebench/stages.py); False: no timing at all.
    stage_times: bool = True
    # Batches the loader starts on at once (n_workers x prefetch_factor): the steady rate leaves
    # them out.
    in_flight: int = 0
    # An emulated accelerator takes each batch the host hands over (host_only), in place of a
    # model; with several ranks, they meet at `barrier` after each step.
    accelerator: Accelerator | None = None
    barrier: Callable[[], None] | None = None

    def enough(self, n_batches: int, elapsed_s: float) -> bool:
        """Whether the epoch stops here, short of the loader's end."""
        if self.max_batches and n_batches >= self.max_batches:
            return True
        timed_out = self.time_limit_s and elapsed_s >= self.time_limit_s
        # Past the batches made at the start (the steady rate's warm-up), and a few more.
        return bool(timed_out) and n_batches >= max(_MIN_BATCHES, self.in_flight + 2)


def run_epoch(
    make_batches: Callable[[], Iterable[Batch]],
    trainer: Trainer | None,
    settings: EpochSettings,
) -> EpochResult:
    """One timed epoch. `trainer=None` is loader-only mode: batches are finished on the device
    (or, with host_only, only received), no model runs.

    The clock starts before the loader is built, so worker start-up counts, as in the article.
    """
    # A dead worker can surface anywhere in the loop, even in its clean-up: the whole epoch is
    # inside the translation, and torch's SIGCHLD check raises only where the loop receives it.
    with WorkerDeaths() as deaths:
        try:
            return _timed_epoch(make_batches, trainer, settings, deaths)
        except BaseException as error:
            failure = explain(error, settings.loader_name) if isinstance(error, Exception) else None
            previous = quiet_sigchld() if failure is not None else None
            # The traceback holds the loader's iterator (in the frames it passed through). Let
            # it go now, so that its workers are shut down here, by reference count, and not
            # later by the garbage collector, which may finalize the iterator's queues first
            # and then wait 5 s for each worker (a DataLoader that raised from a worker does).
            traceback.clear_frames(error.__traceback__)
            if failure is None:
                raise
        # Past the except block the error and its traceback are gone, and with them the last
        # references to the loader's iterator: its workers shut down now, while torch's SIGCHLD
        # handler (which would raise again for the workers it sees go) stays quiet.
        try:
            gc.collect()
        finally:
            restore_sigchld(previous)
    raise failure


def _timed_epoch(
    make_batches: Callable[[], Iterable[Batch]],
    trainer: Trainer | None,
    settings: EpochSettings,
    deaths: WorkerDeaths,
) -> EpochResult:
    device = settings.device
    meter, busy = EpochMeter(device, in_flight=settings.in_flight), DeviceBusy(device)
    monitor, emulated = UsageMonitor(device, settings.sample_hz), _emulated(settings)
    monitor.open_gpu()  # NVML start-up, outside the clock
    bar, seen = epoch_progress(settings.expected_images, settings.description), Seen()
    totals = stages.begin_epoch(settings.stage_times)  # before any worker is forked
    batches = made = None
    try:
        meter.start()
        monitor.start(meter.started_at)
        timeline = loop_timeline(settings.stage_times, totals, meter.started_at, meter.clock)
        finish = Finisher(settings.device, settings.geometry)
        use = BatchUse(trainer, finish, busy, seen, timeline, settings.host_only, emulated)
        # Building the loader (listing files, forking workers) is part of waiting for the first
        # batch: the first wait is counted from the start of the epoch.
        asked_at = meter.started_at
        with settings.join or nullcontext():
            made = make_batches()
            batches = _feed(timeline.measured(made), settings)
            timeline.mark("wait")
            feeding = "finish" if _finishes_ahead(settings) else "handover"
            for batch, ready in batches:
                meter.batch(asked_at, len(batch.labels))
                timeline.arrived(feeding)
                deaths.check()
                seen.add(batch)
                timeline.mark("handover")
                use(batch, ready)
                bar.update(len(batch.labels))
                if settings.enough(meter.n_batches, meter.elapsed()):
                    break
                asked_at = meter.now()
                timeline.mark("handover")
            deaths.check()
        use.end()
        times = meter.stop()
        timeline.close(meter.ended_at, use.tail())
        resources = monitor.stop(meter.ended_at)  # workers still alive: their counters count
        library = library_metrics(made)  # outside the clock: it may ask the library for them
    finally:
        monitor.close()
        bar.close()
        # Shut worker processes down now (the iterator's finalizer does it), not at exit.
        del batches, made
    return EpochResult(
        times=times,
        resources=resources,
        **seen.outcome(settings.label_counts),
        device_busy=busy.metrics(times.epoch_time_s),
        stages=totals.metrics(times.samples_seen, times.epoch_time_s),
        emulated=emulated.metrics(meter.ended_at) if emulated is not None else {},
        library=library,
        fetches=totals.fetches if totals.enabled and totals.fetches else None,
    )


def library_metrics(made: object) -> dict[str, float]:
    """What a loader's batches report of their epoch once it ended (`epoch_metrics()`, where
    they have it: Ray Data's per-operator statistics), else nothing."""
    report = getattr(made, "epoch_metrics", None)
    return report() if callable(report) else {}


def _emulated(settings: EpochSettings) -> EmulatedSteps | None:
    if settings.accelerator is None:
        return None
    return EmulatedSteps(settings.accelerator, settings.barrier)


def _feed(loader: Iterable[Batch], settings: EpochSettings) -> Iterator[tuple[Batch, Ready | None]]:
    """The loader's batches, each with its images and labels ready for the model when the host
    finishes them (a CPU device: in threads, ahead of the loop), or None when the loop does (a
    GPU: the copy and the arithmetic are device work) or nothing does (host_only)."""
    if _finishes_ahead(settings):
        return finished_ahead_on_cpu(loader, n_threads=usable_cores(), geometry=settings.geometry)
    return ((batch, None) for batch in loader)


def _finishes_ahead(settings: EpochSettings) -> bool:
    return settings.device.type == "cpu" and not settings.host_only
