"""The compute ceiling: the model training on one batch made once on the device, in a budget.

One training step of ResNet-50 on 600 images takes well under a second on a GPU but half a
minute on a 2-core CPU, so the steps needed for a steady rate can take longer than advise's whole
budget there. A few steps on a small batch come first: they say how long a step of the asked
batch would take, and the ceiling is then measured with the asked batch if its steps fit in the
time left, or with the largest batch (a power of two) that does.

Each measurement leaves its first steps out (the allocator and the kernels are chosen on the
first steps of every new shape: on a CPU the first step of a new batch size took 3-10 times
the others), then times each step on its own and takes the median, over at least MIN_STEPS
steps and MIN_SECONDS. Where the timed steps disagree (other work on the machine), the answer
says the measurement was noisy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

from facebench import loaders
from facebench.advise.measure import with_loader
from facebench.config import AdviseConfig
from facebench.data.job_data import JobData
from facebench.host.device import synchronize
from facebench.loaders import ceiling
from facebench.loaders.shared import LoaderContext
from facebench.run.accelerator import Accelerator
from facebench.run.job import Job
from facebench.run.training import Trainer

PROBE_BATCH = 8  # images per step while timing one step
WARMUP_STEPS = 2  # of every batch size, left out: allocation, kernel choice
PROBE_STEPS = 3  # timed steps of the probe batch
MIN_STEPS = 5  # timed steps of the measured batch, at least,
MIN_SECONDS = 3.0  # for at least this long, where the budget allows
# Timed steps whose spread ((slowest - fastest) / median) is above this: a noisy measurement.
NOISY_SPREAD = 0.25
CEILING = loaders.get("ceiling")
clock = time.perf_counter  # seconds; the tests' fake clock moves as their fake steps run


@dataclass(frozen=True)
class Ceiling:
    images_per_s: float
    batch_size: int  # the batch it was measured with
    asked_batch_size: int  # the batch the user asked for
    seconds: float  # time spent measuring it
    steps: int = 0  # timed steps the rate is the median of
    spread: float = 0.0  # (slowest - fastest) / median of those steps
    source: str = ""  # an emulated accelerator's: where its rate comes from

    @classmethod
    def emulated(cls, accelerator: Accelerator, batch_size: int) -> Ceiling:
        """The pace an emulated accelerator needs to be fed at its min_au (what train.py's au_pass
        asks): its rate x min_au. Nothing to measure."""
        pace = accelerator.images_per_s * accelerator.min_au
        source = (
            f"{accelerator.name}, {accelerator.images_per_s:,.0f} images/s ({accelerator.source}); "
            f"fed at AU >= {accelerator.min_au:.0%} means {pace:,.0f} images/s"
        )
        return cls(pace, batch_size, batch_size, 0.0, source=source)

    @property
    def smaller_batch(self) -> bool:
        return self.batch_size < self.asked_batch_size

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY_SPREAD

    def note(self) -> str:
        """How it was measured, where that matters: a smaller batch than asked, steps that
        disagreed."""
        notes = [f"emulated: {self.source}"] if self.source else []
        if self.smaller_batch:
            notes.append(
                f"measured with batch_size={self.batch_size}, not {self.asked_batch_size}: a "
                "step of the asked batch would not fit advise's share of budget_s for it"
            )
        if self.noisy:
            notes.append(
                f"a noisy measurement: its {self.steps} timed steps differed by "
                f"{self.spread:.0%} of their median (other work on the machine?); measure "
                "again when the machine is quiet"
            )
        return f" ({'; '.join(notes)})" if notes else ""


def measure_ceiling(cfg: AdviseConfig, job: Job, data: JobData, seconds: float) -> Ceiling:
    """The model's training rate with nothing to wait for, measured within about `seconds`."""
    started = clock()
    cfg = with_loader(cfg, "ceiling")
    trainer = job.trainer(cfg, data.listing.labels)
    assert trainer is not None  # advise refuses model=none
    ctx = loaders.context(cfg, CEILING, data.listing, job.device)
    asked = cfg.batch_size
    probe = min(asked, PROBE_BATCH)
    steps = _step_times(trainer, replace(ctx, batch_size=probe), PROBE_STEPS, 0.0)
    left = seconds - (clock() - started)
    per_image = statistics.median(steps) / probe
    batch = _fitting_batch(asked, left / ((WARMUP_STEPS + MIN_STEPS) * per_image))
    if batch > probe:
        warmup_s = WARMUP_STEPS * per_image * batch
        timed_s = max(0.0, min(MIN_SECONDS, left - warmup_s))  # what the budget allows of it
        steps = _step_times(trainer, replace(ctx, batch_size=batch), MIN_STEPS, timed_s)
    else:
        batch = probe
    median = statistics.median(steps)
    return Ceiling(
        batch / median,
        batch,
        asked,
        clock() - started,
        steps=len(steps),
        spread=(max(steps) - min(steps)) / median,
    )


def _fitting_batch(asked: int, fits: float) -> int:
    """The asked batch if that many images fit in one step's time, else the largest power of
    two that does."""
    if fits >= asked:
        return asked
    batch = 1
    while batch * 2 <= fits:
        batch *= 2
    return batch


def _step_times(
    trainer: Trainer, ctx: LoaderContext, min_steps: int, min_seconds: float
) -> list[float]:
    """Seconds of each timed training step on one synthetic batch of ctx.batch_size: WARMUP_STEPS
    first, untimed, then at least `min_steps` and at least `min_seconds` of them."""
    batch = next(iter(ceiling.build(ctx)))
    for _ in range(WARMUP_STEPS):
        trainer.step(batch.images, batch.labels)
    synchronize(ctx.device)
    times: list[float] = []
    begun = clock()
    while len(times) < min_steps or clock() - begun < min_seconds:
        start = clock()
        trainer.step(batch.images, batch.labels)
        synchronize(ctx.device)  # a step's time is its kernels', not the time to queue them
        times.append(clock() - start)
    return times
