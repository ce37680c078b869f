"""The compute ceiling: one batch made once, already on the device, handed out every step.

No files, no decoding, no copies: an epoch of the same length as the data's, so its images/s is
the fastest this model can train on this hardware. Another run's images/s divided by this says
how close that pipeline comes to keeping the device busy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from facebench.config import LoaderConfig, Workers
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits


@dataclass
class SameBatch:
    images: torch.Tensor
    labels: torch.Tensor
    n_batches: int

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.n_batches):
            yield Batch(self.images, self.labels, None)


def build(ctx: LoaderContext) -> SameBatch:
    generator = torch.Generator(device=ctx.device).manual_seed(ctx.seed)
    images = torch.randn(
        (ctx.batch_size, 3, *ctx.geometry.cropped), generator=generator, device=ctx.device
    ).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(
        0, ctx.labels.n_classes, (ctx.batch_size,), generator=generator, device=ctx.device
    )
    # Each rank trains on its share, as with real loaders: the job's epoch is the data's.
    return SameBatch(images, labels, ctx.plan.n_batches)


def worker_memory(ctx: LoaderContext) -> int:
    return 0  # no workers


# No real samples: nothing to count, check or read.
LOADER = LoaderSpec(
    options=LoaderConfig,
    build=build,
    worker_memory=worker_memory,
    traits=Traits(Handover.normalized, Pixels.exact, Workers.none),
    ceiling=True,
    stage_times=False,  # no worker side: the batch is made once, before the epoch
    bucket_refusal="it reads no data (the compute ceiling): run it without storage=s3",
)
