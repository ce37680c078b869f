"""Emulated accelerators, the way MLPerf Storage emulates them: each training step is replaced by
the step's time on the accelerator, so that a machine without that GPU learns whether a loader
keeps it busy.

The loop takes each batch as a GPU run's host side hands it over (as host_only does), then
passes the accelerator's time for it, then, with several accelerators, meets the other ranks at
a barrier (which stands for the gradients' all-reduce; DLIO does the same). Accelerator
utilization is DLIO's: the time the accelerator computed over the time the epoch took, both
counted from the end of the first step (whose wait is for the workers' start-up, not for the
loader's pace).

Two things DLIO leaves out, emulated here:
- The host CPU a real training step uses (`accelerator.host_cpu`, a share of one core):
  launching kernels, the optimizer's Python, and CUDA's wait for the step, which spins while
  the host has more cores than CUDA contexts. Whenever the loop waits for the accelerator it
  spins that share of the wait (hashing, which leaves Python's GIL free, as CUDA's wait does)
  and sleeps the rest, so the loader's workers and threads compete with it as they do on a GPU
  host. DLIO sleeps: its host idles, and a host with few cores per GPU looks better fed than
  it is.
- When the host waits (`accelerator.sync`): every_step, the loop waits for each step before
  it asks for the next batch (the article's loop reads the loss every step); none, the step
  computes while the loop fetches the next batch, with at most `queue` steps launched and not
  finished, as CUDA's launch queue runs ahead of the host; the epoch's end waits for the last.

What emulation cannot show: the copy of each batch to the GPU (PCIe), finishing or decoding on
the GPU (uint8 batches cropped there, nvJPEG, DALI's `mixed` decoder), NCCL's traffic between
GPUs.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from facebench.config import AcceleratorConfig, Sync
from facebench.errors import ConfigError

NONE = "none"


@dataclass(frozen=True)
class Accelerator:
    """An accelerator as a run emulates it: its rate at the run's crop, and where it comes from."""

    name: str
    images_per_s: float  # at the run's crop
    min_au: float
    source: str
    scaled_from: int = 0  # the image side a published rate was scaled from; 0: not scaled
    host_cpu: float = 0.0  # the share of one core the training process uses during a step
    sync: Sync = Sync.every_step
    queue: int = 2

    @classmethod
    def of(cls, config: AcceleratorConfig, crop: int, batch_size: int) -> Accelerator | None:
        """The configured accelerator at this crop; None for accelerator=none."""
        if config.name == NONE:
            return None
        if config.images_per_s > 0:
            rate = config.images_per_s
        elif config.step_s > 0:
            rate = (config.step_batch or batch_size) / config.step_s
        else:
            raise ConfigError(
                f"accelerator={config.name}: give its rate, accelerator.images_per_s=N (images "
                "a second at this run's crop), or accelerator.step_s=S (seconds a step of "
                "accelerator.step_batch images, batch_size by default, takes)"
            )
        scale = (config.measured_at / crop) ** 2 if config.measured_at else 1.0
        scaled_from = config.measured_at if config.measured_at not in (0, crop) else 0
        return cls(
            config.name,
            rate * scale,
            config.min_au,
            config.source,
            scaled_from,
            config.host_cpu,
            Sync(config.sync),
            config.queue,
        )

    def describe(self) -> str:
        """'h100 (8,960 images/s)'."""
        return f"{self.name} ({self.images_per_s:,.0f} images/s)"

    def step_s(self, images: int) -> float:
        return images / self.images_per_s

    def params(self) -> dict[str, str | float]:
        """What a run records of it, beside the config's own keys."""
        return {
            "accelerator_images_per_s": round(self.images_per_s, 1),
            "accelerator_scaled_from": self.scaled_from or "",
        }


Clock = Callable[[], float]

# CUDA's wait spins in C, the GIL released. Hashing does too (hashlib releases it above 2 KB),
# in calls of up to _SPIN_CALL_S each: long enough that taking the GIL back between calls (up to
# Python's 5 ms switch interval, while a loader's thread holds it) costs a small share.
_SPIN_CALL_S = 0.01
_spin_buffer = memoryview(b"")
_spin_bytes_per_s = 0.0


def spin(seconds: float, clock: Clock = time.perf_counter) -> None:
    """Keep this thread's core busy for `seconds`, leaving the GIL to the process's other
    threads meanwhile."""
    global _spin_buffer, _spin_bytes_per_s
    if not _spin_bytes_per_s:  # once: how fast this machine hashes
        sample = bytes(2**20)
        started = time.thread_time()  # CPU time: not the wait for the GIL afterwards
        hashlib.sha1(sample)
        _spin_bytes_per_s = len(sample) / max(time.thread_time() - started, 1e-4)
        _spin_buffer = memoryview(bytes(int(_spin_bytes_per_s * _SPIN_CALL_S)))
    end = clock() + seconds
    while (left := end - clock()) > 0:
        size = min(len(_spin_buffer), max(4096, int(left * _spin_bytes_per_s)))
        hashlib.sha1(_spin_buffer[:size])


@dataclass
class EmulatedSteps:
    """One epoch's emulated steps on an accelerator's timeline: each starts once it is handed
    over and the accelerator is free; the loop waits for it at once (sync=every_step) or only
    once `queue` steps are launched and not finished (sync=none), spinning its host_cpu share
    of every wait; then, with several ranks, the barrier."""

    accelerator: Accelerator
    barrier: Callable[[], None] | None = None
    clock: Clock = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    busy: Callable[[float], None] = spin
    _computed_s: list[float] = field(default_factory=list)
    _first_end: float | None = None
    _free_at: float = 0.0  # when the accelerator finishes the steps launched so far
    _launched: deque[float] = field(default_factory=deque)  # their ends, not yet waited for
    _host_s: float = 0.0
    _late_s: float = 0.0  # how long after their steps' ends the loop went on

    def step(self, images: int) -> None:
        """The accelerator trains on a batch of `images`; the loop goes on when `sync` says."""
        step_s = self.accelerator.step_s(images)
        end = max(self.clock(), self._free_at) + step_s
        self._free_at = end
        self._launched.append(end)
        if self._first_end is None:
            self._first_end = end
        ahead = self.accelerator.queue if self.accelerator.sync == Sync.none else 0
        while len(self._launched) > ahead:
            self._wait_until(self._launched.popleft())
        # The step's own time, as DLIO counts it: a step handed over late (the loop woke late,
        # its host busy, the loader slow) leaves the accelerator idle until it is.
        self._computed_s.append(step_s)
        if self.barrier is not None:
            self.barrier()

    def finish(self) -> None:
        """The epoch's end: the steps still computing are waited for, as a host synchronizes
        before its clock stops (none left with sync=every_step)."""
        while self._launched:
            self._wait_until(self._launched.popleft())

    def _wait_until(self, moment: float) -> None:
        """Wait for the accelerator as a GPU run's host does: its host_cpu share of the wait
        spun (CUDA's spinning wait, the launches, the optimizer), the rest slept."""
        left = moment - self.clock()
        if left <= 0:
            return
        host_s = left * self.accelerator.host_cpu
        if host_s > 0:
            self.busy(host_s)
            self._host_s += host_s
        left = moment - self.clock()
        if left > 0:
            self.sleep(left)
        # The spun share competes for the cores as a training process's spinning wait does: on a
        # host whose cores other processes fill, the fair scheduler runs it late, and the
        # accelerator idles meanwhile, as a real one would on that host. Counted, to be said.
        self._late_s += max(0.0, self.clock() - moment)

    def metrics(self, epoch_end: float) -> dict[str, float]:
        """au (DLIO's accelerator utilization, the first step left out), au_pass against the
        accelerator's min_au, the time it computed and the host CPU its steps spun; nothing
        over fewer than two steps."""
        if len(self._computed_s) < 2 or self._first_end is None:
            return {}
        span = epoch_end - self._first_end
        computed = sum(self._computed_s[1:])
        au = min(1.0, computed / span) if span > 0 else 0.0
        return {
            "au": au,
            "au_pass": float(au >= self.accelerator.min_au),
            "accelerator_compute_s": sum(self._computed_s),
            "accelerator_steps": float(len(self._computed_s)),
            "accelerator_host_cpu_s": self._host_s,
            "accelerator_late_s": self._late_s,
        }
