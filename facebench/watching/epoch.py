"""One epoch of a user's loop, measured as train.py measures its own: the wait in `next()`
against the time between batches (the user's step), images/s, time to the first batch, CPU and
memory of the loop and its workers, the stages inside the workers, and on CUDA the GPU's wait
for data (facebench/watching/gpu_wait.py) and NVML's utilization.

The clock starts before the loader's iterator is made (its workers' start-up is the first
batch's wait) and stops where the loop ended, however it ended; the device is synchronized at
those two moments only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

from facebench import stages
from facebench.custom.carrier import first_tensor
from facebench.custom.checks import Observed
from facebench.measure.meter import EpochMeter
from facebench.measure.timeline import LoopTimeline
from facebench.measure.usage import UsageMonitor
from facebench.watching.gpu_wait import GpuWait
from facebench.watching.reach import Reach

log = logging.getLogger(__name__)

SAMPLE_HZ = 4.0  # memory and GPU utilization samples a second, as train.py's default


class WatchedEpoch:
    """Start it, pass the batches through `batches`, then `end` it for its metrics."""

    def __init__(self, reach: Reach, device: torch.device, key: str, observed: Observed) -> None:
        self.reach = reach
        self.device = device
        self.key = key  # the dict key or tuple index a batch is counted by
        self.observed = observed
        self.meter = EpochMeter(device, in_flight=reach.in_flight)
        self.monitor = UsageMonitor(device, SAMPLE_HZ)
        self.gpu = GpuWait(device.type == "cuda")
        self.totals: stages.StageTotals | None = None
        self.timeline: LoopTimeline | None = None
        self.uncounted: str = ""  # a batch with no tensor to count it by: what it was
        self._ended = False

    def start(self) -> None:
        self.monitor.open_gpu()  # NVML's start-up, outside the clock
        self.totals = stages.begin_epoch(True)  # before the workers are forked
        self.meter.start()
        self.monitor.start(self.meter.started_at)
        self.timeline = LoopTimeline(self.totals, self.meter.started_at, self.meter.clock)
        self.gpu.start()

    def batches(self) -> Iterator[Any]:
        """The user's batches, unchanged; each one's wait, hand-over and step measured."""
        meter, timeline, gpu = self.meter, self.timeline, self.gpu
        asked_at = meter.started_at
        for arrival in timeline.measured(self.reach.arrivals()):
            n = self._count(arrival.batch)
            meter.batch(asked_at, n)
            timeline.arrived("step")  # since the last batch: the user's step, and the loader
            self.observed.add(n, arrival.carried)
            gpu.handover()
            yield arrival.batch
            gpu.request()
            asked_at = meter.now()

    def _count(self, batch: Any) -> int:
        tensor = first_tensor(batch, self.key)
        if tensor is not None and tensor.dim() > 0:
            return len(tensor)
        if not self.uncounted:
            self.uncounted = type(batch).__name__
        return 0

    def end(self) -> dict[str, float]:
        """The epoch's metrics, its clock stopped now; nothing where no batch came."""
        if self._ended:
            return {}
        self._ended = True
        try:
            self.gpu.stop()  # the GPU's end, as the loop's: before the clock's own work
            times = self.meter.stop()
            self.timeline.close(self.meter.ended_at, "step")
            metrics = {**times.metrics(), **self.monitor.stop(self.meter.ended_at)}
        finally:
            self.monitor.close()
        if times.batches == 0:
            return {}
        metrics.update(self.gpu.metrics())
        if times.samples_seen:  # per image: none where a batch had nothing to count
            metrics.update(self.totals.metrics(times.samples_seen, times.epoch_time_s))
        metrics.update(self.observed.conclude())
        return metrics
