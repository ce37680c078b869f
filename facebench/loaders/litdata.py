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

With storage=s3 the chunks are where prepare.py storage=s3 uploaded them, and LitData streams
them itself: its S3 downloader (boto3, given the job's endpoint, addressing, bounded waits and
retries as storage_options) fetches each chunk whole into a local chunk cache, a few chunks
ahead. That cache is the job's own (emptied when the job starts and removed when it ends), so
the first epoch reads the bucket and later ones, as far as the cache holds, the local disk: the
per-epoch storage_* metrics tell them apart. Each chunk's download is counted as one GET, with
its whole time as latency (LitData shows no first byte).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from facebench import stages
from facebench.config import LoaderConfig, Workers
from facebench.errors import ShardError
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders.litdata_bucket import (
    allow_plain_http,
    counting_downloader,
    fetch_failure,
    take_downloads,
)
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shardsets import open_shard_set
from facebench.loaders.shared import Batch, LoaderContext, stack, stamped, uint8_batch
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits
from facebench.shards import litdata_format
from facebench.storage import client


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
            try:
                item = super().__next__()
            except Exception as error:  # the reader wraps a failed download in its own words
                failed = fetch_failure(error)
                if failed is None:
                    raise
                raise failed from None
            stages.lap(stages.READ, start)
            take_downloads()
            return item

    return TimedStreamingDataset


def worker_memory(ctx: LoaderContext) -> int:
    return shared.worker_memory(ctx, normalized=False)


def _bucket_cache(ctx: LoaderContext) -> Path:
    """This job's chunk cache for a set in a bucket (by the process that runs the job)."""
    return ctx.cache / "litdata-cache" / f"bucket-job-{os.getpid()}"


@contextmanager
def session(ctx: LoaderContext) -> Iterator[dict[str, float]]:
    """For a set in a bucket: a chunk cache of the job's own, empty at its start (chunks a
    previous job left would make its first epoch read the disk), removed at its end."""
    if not isinstance(ctx.shards_dir, str):
        yield {}
        return
    cache = _bucket_cache(ctx)
    shutil.rmtree(cache, ignore_errors=True)
    try:
        yield {}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _remote(ctx: LoaderContext) -> dict[str, Any]:
    """StreamingDataset's options for a set in a bucket: the job's endpoint, LitData's client."""
    if not isinstance(ctx.shards_dir, str):
        return {"cache_dir": str(ctx.cache / "litdata-cache")}
    counting_downloader()
    endpoint = client.configured()
    allow_plain_http(endpoint)
    return {
        "cache_dir": str(_bucket_cache(ctx)),
        "storage_options": client.boto_options(endpoint),
        "session_options": {"profile_name": endpoint.profile} if endpoint.profile else {},
    }


def build(ctx: LoaderContext) -> Iterable[Batch]:
    from litdata import StreamingDataLoader

    shard_set = open_shard_set(ctx)
    plan = ctx.plan
    dataset = timed_dataset()(
        input_dir=str(shard_set.folder),
        shuffle=True,
        seed=plan.seed % 2**31,  # LitData deals and shuffles the chunks itself, from this seed
        drop_last=True,
        serializers=litdata_format.serializers(),  # numpy and int only: nothing that unpickles
        **_remote(ctx),
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
    session=session,
    bucket_refusal=None,
    own_client="boto3, or obstore, LitData's own",
)
