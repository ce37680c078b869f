"""The compute ceiling: the model training on one batch made once on the device, in a budget.

One training step of ResNet-50 on 600 images takes well under a second on a GPU but half a
minute on a 2-core CPU, so the steps needed for a steady rate (a warm-up step and three more) can
take longer than advise's whole budget there. A few steps on a small batch come first: they say
how long a step of the asked batch would take, and the ceiling is then measured with the asked
batch if its steps fit in the time left, or with the largest batch (a power of two) that does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from facebench import loaders
from facebench.advise.measure import with_loader
from facebench.config import AdviseConfig, TrainConfig
from facebench.data.job_data import JobData
from facebench.epoch import EpochSettings, run_epoch
from facebench.job import Job
from facebench.loaders import synthetic
from facebench.runner import trainer_for
from facebench.training import Trainer

PROBE_BATCH = 8  # images per step while timing one step
PROBE_STEPS = 2  # the first warms up (allocation, kernel choice); the second is timed
STEPS = 4  # a warm-up step and three timed ones: the fewest that give a steady rate
_UNTIL_TIME_LIMIT = 10**9  # steps: the time limit ends the measurement
CEILING = loaders.get("synthetic")


@dataclass(frozen=True)
class Ceiling:
    images_per_s: float
    batch_size: int  # the batch it was measured with
    asked_batch_size: int  # the batch the user asked for
    seconds: float  # time spent measuring it

    @property
    def smaller_batch(self) -> bool:
        return self.batch_size < self.asked_batch_size

    def note(self) -> str:
        """How it was measured, when not with the batch asked for."""
        if not self.smaller_batch:
            return ""
        return (
            f" (measured with batch_size={self.batch_size}, not {self.asked_batch_size}: a "
            "step of the asked batch would not fit advise's share of budget_s for it)"
        )


def measure_ceiling(cfg: AdviseConfig, job: Job, data: JobData, seconds: float) -> Ceiling:
    """The model's training rate with nothing to wait for, measured within about `seconds`."""
    started = time.perf_counter()
    cfg = with_loader(cfg, "synthetic")
    trainer = trainer_for(cfg, job, data.listing.labels)
    asked = cfg.batch_size
    probe = min(asked, PROBE_BATCH)
    rate = _steps(cfg, job, data, trainer, probe, PROBE_STEPS)
    left = seconds - (time.perf_counter() - started)
    batch = _fitting_batch(asked, rate * left / STEPS)
    if batch > probe:
        rate = _steps(cfg, job, data, trainer, batch, _UNTIL_TIME_LIMIT, max(left, 0.0))
    else:
        batch = probe
    return Ceiling(rate, batch, asked, time.perf_counter() - started)


def _fitting_batch(asked: int, fits: float) -> int:
    """The asked batch if that many images fit in one step's time, else the largest power of
    two that does."""
    if fits >= asked:
        return asked
    batch = 1
    while batch * 2 <= fits:
        batch *= 2
    return batch


def _steps(
    cfg: TrainConfig,
    job: Job,
    data: JobData,
    trainer: Trainer | None,
    batch: int,
    n_steps: int,
    time_limit_s: float = 0.0,
) -> float:
    """Images per second of n_steps training steps (or as many as time_limit_s allows) on one
    synthetic batch of this size, however small the data set is."""
    ctx = loaders.context(cfg, CEILING, data.listing, job.device)
    ctx = replace(ctx, batch_size=batch)
    settings = EpochSettings(
        job.device, sample_hz=0, time_limit_s=time_limit_s, geometry=ctx.geometry
    )
    result = run_epoch(lambda: replace(synthetic.build(ctx), n_batches=n_steps), trainer, settings)
    return result.times.steady_images_per_s
