"""LitData: chunks written by litdata.optimize (prepare.py format=litdata), streamed by its
StreamingDataset and StreamingDataLoader.

    StreamingDataset(shards, shuffle=True, seed=this epoch's) -> StreamingDataLoader(batch_size,
    n_workers, drop_last) -> uint8 batches and crop offsets for facebench.run.finish

LitData deals chunks to ranks and workers and shuffles them, and the samples within them, anew
each epoch (its seed is the epoch's). Its items are decoded 112x112 samples (see
shards/litdata_format.py); each carries its id and label, and the label is checked against the
run's own listing: a damaged chunk stops the run rather than mislabel a sample. Each worker
batches the samples it reads, so up to one partial batch per worker is dropped, as with the other
loaders whose workers read whole shards.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
import torch

from facebench import stages
from facebench.config import LoaderConfig, Workers
from facebench.errors import ShardError
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shardsets import open_shard_set
from facebench.loaders.shared import Batch, LoaderContext, stack, stamped, uint8_batch
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits
from facebench.shards import litdata_format


class Collate:
    """LitData items -> one Batch; each item's label checked against the run's listing."""

    def __init__(self, labels: np.ndarray, folder: str, plan: EpochPlan) -> None:
        self.labels = labels
        self.folder = folder
        self.plan = plan

    def __call__(self, items: list[dict]) -> Batch:
        start = stages.now()
        ids = torch.tensor([int(item["id"]) for item in items])
        labels = torch.tensor([int(item["label"]) for item in items])
        known = (ids >= 0) & (ids < len(self.labels))
        if not bool(known.all()) or not np.array_equal(self.labels[ids.numpy()], labels.numpy()):
            raise ShardError(
                f"{self.folder}: a sample's id or label is not the data's; the chunks are damaged "
                "or stale. Rebuild: python prepare.py format=litdata"
            )
        images = stack([item["image"] for item in items])
        return stamped(uint8_batch(images, labels, ids, self.plan), start)


@functools.cache
def timed_dataset() -> type:
    """StreamingDataset whose items are timed as the read stage: getting an item is reading
    its chunk and its bytes (its pixels are stored decoded). Made on first use: litdata is an
    optional extra."""
    from litdata import StreamingDataset

    class TimedStreamingDataset(StreamingDataset):
        def __next__(self) -> dict:
            start = stages.now()
            item = super().__next__()
            stages.lap(stages.READ, start)
            return item

    return TimedStreamingDataset


def worker_memory(ctx: LoaderContext) -> int:
    return shared.worker_memory(ctx, normalized=False)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    from litdata import StreamingDataLoader

    shard_set = open_shard_set(ctx)
    plan = ctx.plan
    dataset = timed_dataset()(
        input_dir=str(shard_set.folder),
        cache_dir=str(ctx.cache / "litdata-cache"),
        shuffle=True,
        seed=plan.seed % 2**31,  # LitData deals and shuffles the chunks itself, from this seed
        drop_last=True,
        serializers=litdata_format.serializers(),  # numpy and int only: nothing that unpickles
    )
    labels = np.array([record.label for record in ctx.records], dtype=np.int64)
    extra = {"prefetch_factor": ctx.options.prefetch_factor} if ctx.n_workers else {}
    return StreamingDataLoader(
        dataset,
        batch_size=ctx.batch_size,
        num_workers=ctx.n_workers,
        collate_fn=Collate(labels, str(shard_set.folder), plan),
        drop_last=True,
        pin_memory=ctx.pin_memory,
        **extra,
    )


LOADER = LoaderSpec(
    options=LoaderConfig,
    build=build,
    worker_memory=worker_memory,
    traits=Traits(Handover.uint8, Pixels.exact, Workers.process),
    shard_format="litdata",
    batches_per_worker=True,  # each worker batches the chunks it reads
    requires=Requirement("litdata", "litdata"),
)
