"""Emulated accelerators, the way MLPerf Storage emulates them: each training step is replaced by
a wait of the step's time on the accelerator, so that a machine without that GPU learns whether
a loader keeps it busy.

The loop takes each batch as a GPU run's host side hands it over (as host_only does), then waits
the accelerator's time for it (`time.sleep`, so that loader threads of the loop's process run
meanwhile), then, with several accelerators, meets the other ranks at a barrier (which stands
for the gradients' all-reduce; DLIO does the same). Accelerator utilization is DLIO's: the time
the accelerator computed over the time the epoch took, both counted from the end of the first
step (whose wait is for the workers' start-up, not for the loader's pace).

What emulation cannot show: the copy of each batch to the GPU (PCIe), finishing or decoding on
the GPU (uint8 batches cropped there, nvJPEG, DALI's `mixed` decoder), NCCL's traffic between
GPUs, and the host CPU the real training step uses (kernel launches, the optimizer's Python).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from facebench.config import AcceleratorConfig
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
        return cls(config.name, rate * scale, config.min_au, config.source, scaled_from)

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


@dataclass
class EmulatedSteps:
    """One epoch's emulated steps: each waited for, then (with several ranks) the barrier."""

    accelerator: Accelerator
    barrier: Callable[[], None] | None = None
    clock: Clock = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    _computed_s: list[float] = field(default_factory=list)
    _first_end: float | None = None

    def step(self, images: int) -> None:
        """The accelerator trains on a batch of `images`: wait its time, then the other ranks."""
        step_s = self.accelerator.step_s(images)
        self.sleep(step_s)
        # The step's own time, as DLIO counts it: a sleep that ends late (this process woke
        # late, its host busy) is time a real accelerator would have sat idle, waiting for the
        # host to hand it the next batch.
        self._computed_s.append(step_s)
        if self.barrier is not None:
            self.barrier()
        if self._first_end is None:
            self._first_end = self.clock()

    def metrics(self, epoch_end: float) -> dict[str, float]:
        """au (DLIO's accelerator utilization, the first step left out), au_pass against the
        accelerator's min_au, and the time it computed; nothing over fewer than two steps."""
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
        }
