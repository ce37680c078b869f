"""Timing one epoch: when it started, when each batch arrived, how long the loop waited for it.

The loop calls `start` before the loader is built (so worker start-up is inside the epoch, as in
the article), `batch` after each `next(loader)`, and `stop` after the last step, which synchronizes
the device first. Nothing here touches the device per batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from facebench.host.device import synchronize

# Batches excluded from the steady-state rate, with the wait for the first batch after them: worker
# start-up, first-touch allocations, cuDNN autotuning. A tenth of the epoch, 1 to 20 batches, and
# at least the batches the loader starts on at once (n_workers x prefetch_factor): those are all
# made from the start, in parallel, and arrive close together (on 6,000 images, 5 workers' first
# 10 batches made a "steady" rate of 45,000/s where the epoch ran at 2,000).
WARMUP_FRACTION = 0.1
WARMUP_MAX_BATCHES = 20
# Batches after the warm-up that a steady rate needs: with fewer, one batch's timing would be the
# whole of it (2 batches of 600 gave "525 images/s, steady 23,570"), so none is reported.
MIN_STEADY_BATCHES = 5


def warmup_batches(n_batches: int, in_flight: int) -> int:
    """The batches an epoch of `n_batches` leaves out of its steady rate (see above), always
    leaving one after them."""
    warmup = max(min(WARMUP_MAX_BATCHES, max(1, int(n_batches * WARMUP_FRACTION))), in_flight)
    return min(warmup, n_batches - 1) if n_batches > 1 else 0


def batches_for_steady(in_flight: int) -> int:
    """The fewest batches an epoch needs for a steady rate, with `in_flight` made at the start."""
    n = MIN_STEADY_BATCHES + 1
    while n - warmup_batches(n, in_flight) < MIN_STEADY_BATCHES:
        n += 1
    return n


@dataclass
class EpochTimes:
    epoch_time_s: float
    time_to_first_batch_s: float
    data_wait_s: float
    samples_seen: int
    batches: int
    warmup_batches: int
    steady_images_per_s: float

    @property
    def images_per_s(self) -> float:
        return self.samples_seen / self.epoch_time_s if self.epoch_time_s > 0 else 0.0

    @property
    def data_wait_frac(self) -> float:
        return min(1.0, self.data_wait_s / self.epoch_time_s) if self.epoch_time_s > 0 else 0.0

    @property
    def compute_s(self) -> float:
        """Time not spent waiting for data: moving batches, the model's steps, loop overhead."""
        return max(0.0, self.epoch_time_s - self.data_wait_s)

    @property
    def steady_measured(self) -> bool:
        """Whether enough batches came after the warm-up to report a steady rate."""
        return self.batches - self.warmup_batches >= MIN_STEADY_BATCHES

    @property
    def rate(self) -> float:
        """The steady rate where enough batches came after the warm-up; else the whole epoch's,
        its start-up and the reads its first batches waited for included. Never the few batches
        after a warm-up that fetched them all (2 batches of 600 from a bucket: "128,851
        images/s", the gap between two batches made before the first arrived)."""
        return self.steady_images_per_s if self.steady_measured else self.images_per_s

    def metrics(self) -> dict[str, float]:
        steady = {"steady_images_per_s": self.steady_images_per_s} if self.steady_measured else {}
        return {
            "epoch_time_s": self.epoch_time_s,
            "images_per_s": self.images_per_s,
            "samples_seen": float(self.samples_seen),
            "batches": float(self.batches),
            "time_to_first_batch_s": self.time_to_first_batch_s,
            **steady,
            "warmup_batches": float(self.warmup_batches),
            "data_wait_s": self.data_wait_s,
            "data_wait_frac": self.data_wait_frac,
            "compute_s": self.compute_s,
        }


@dataclass
class EpochMeter:
    device: torch.device
    # Seconds, monotonic; a test passes a fake one to set every duration exactly.
    clock: Callable[[], float] = time.perf_counter
    in_flight: int = 0  # batches the loader starts on at once: all of them are warm-up
    _start: float = 0.0
    _arrivals: list[float] = field(default_factory=list)  # when each batch was in hand
    _sizes: list[int] = field(default_factory=list)
    _wait: float = 0.0
    _end: float = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self._start = self.clock()

    @property
    def started_at(self) -> float:
        return self._start

    @property
    def ended_at(self) -> float:
        return self._end

    @property
    def n_batches(self) -> int:
        return len(self._sizes)

    def elapsed(self) -> float:
        return self.clock() - self._start

    def now(self) -> float:
        """The clock's reading: taken just before `next(loader)`, it is what `batch` takes."""
        return self.clock()

    def batch(self, asked_at: float, n_samples: int) -> None:
        arrived = self.clock()
        self._wait += arrived - asked_at
        self._arrivals.append(arrived)
        self._sizes.append(n_samples)

    def stop(self) -> EpochTimes:
        synchronize(self.device)
        end = self._end = self.clock()
        n = len(self._sizes)
        warmup = warmup_batches(n, self.in_flight)
        if n >= 2:
            # Whole cycles (a step, then the wait for the next batch) between the arrival of the
            # last warm-up batch and the last arrival: batches warmup .. n-1 came in that time.
            span = self._arrivals[-1] - self._arrivals[warmup - 1]
            steady = sum(self._sizes[warmup:]) / span if span > 0 else 0.0
        else:
            steady = sum(self._sizes) / (end - self._start) if n else 0.0
        return EpochTimes(
            epoch_time_s=end - self._start,
            time_to_first_batch_s=(self._arrivals[0] - self._start) if n else end - self._start,
            data_wait_s=self._wait,
            samples_seen=sum(self._sizes),
            batches=n,
            warmup_batches=warmup,
            steady_images_per_s=steady,
        )


class DeviceBusy:
    """How long the GPU worked during the epoch: CUDA events recorded around each step.

    The events go onto the compute stream with the step's work and are never waited for inside
    the loop; after the clock stops (the device synchronized), each step's start-to-end time is
    what the GPU spent on it. Summed, that is the busy time; the rest of the epoch the GPU waited
    for the loader (or for the host to queue work). Busy over epoch time answers "did the
    loader keep the GPU busy" directly; NVML's utilization stays as a cross-check. A step whose
    kernels are queued slower than they run counts its gaps as busy: at ResNet-50's batch sizes
    they are not. Anywhere but CUDA, it records nothing.
    """

    def __init__(
        self, device: Any, new_event: Callable[[], Any] | None = None, enabled: bool | None = None
    ) -> None:
        self.enabled = getattr(device, "type", device) == "cuda" if enabled is None else enabled
        self._new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._steps: list[tuple[Any, Any]] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = self._new_event()
        start.record()
        yield
        end = self._new_event()
        end.record()
        self._steps.append((start, end))

    def metrics(self, epoch_time_s: float) -> dict[str, float]:
        """Call after the clock stopped: every event has completed by then."""
        if not self._steps or epoch_time_s <= 0:
            return {}
        busy = sum(start.elapsed_time(end) for start, end in self._steps) / 1000.0
        return {
            "gpu_busy_s": busy,
            "gpu_busy_frac": min(1.0, busy / epoch_time_s),
            "gpu_idle_s": max(0.0, epoch_time_s - busy),
        }
