"""A loader kept outside facebench/loaders/, registered as a plugin would register one: loaded
with `pytest -p tests.throwaway_loader`, it joins every list of loaders the tests parametrize
over, without a line of them edited (tests/test_registry.py runs that).

It reads each batch of the epoch plan in the loop itself through the decode stage every
decoding loader composes: the plainest loader that keeps the contract.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from facebench import loaders
from facebench.config import LoaderConfig, Workers
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits


def build(ctx: LoaderContext) -> Iterator[Batch]:
    stage = DecodeStage.of(ctx)
    for positions in ctx.plan.batches():
        records = [ctx.records[int(i)] for i in positions]
        images = [stage.from_file(record) for record in records]
        labels = torch.tensor([r.label for r in records])
        yield stage.batch(images, labels, torch.from_numpy(positions.copy()))


LOADER = LoaderSpec(
    options=LoaderConfig,
    build=build,
    worker_memory=lambda ctx: 0,  # no workers
    traits=Traits(Handover.normalized, Pixels.exact, Workers.none),
)
loaders.register("throwaway", LOADER)
