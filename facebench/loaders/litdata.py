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
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from facebench import stages
from facebench.config import LoaderConfig, Workers
from facebench.errors import ConfigError, ShardError
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shardsets import open_shard_set
from facebench.loaders.shared import Batch, LoaderContext, stack, stamped, uint8_batch
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits
from facebench.shards import litdata_format
from facebench.storage import client

# Chunks downloaded by LitData's threads in this process, not yet counted with a batch: (bytes,
# ns). The stage times are per thread, so the thread that reads the next item takes them.
_downloads: list[tuple[int, int]] = []
_downloads_lock = threading.Lock()


def _take_downloads() -> None:
    with _downloads_lock:
        taken = _downloads[:]
        _downloads.clear()
    for size, latency in taken:
        stages.fetched(size, latency, latency, 0, 0)


@functools.cache
def _counting_downloader() -> type:
    """LitData's S3 downloader, each chunk it downloads counted (registered for s3:// on first
    use, in the process that forks the workers)."""
    from litdata.streaming.downloader import S3Downloader, register_downloader

    class CountingS3Downloader(S3Downloader):
        """Counts each chunk where LitData publishes a download: once per object this process
        fetched, whichever of its sync or asyncio paths fetched it (two workers that both need
        a chunk neither has may each fetch it: both count), timed from when it was asked for."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._asked: dict[str, int] = {}

        def download_file(self, remote_filepath: str, local_filepath: str) -> None:
            self._asked.setdefault(local_filepath, time.perf_counter_ns())
            super().download_file(remote_filepath, local_filepath)

        async def adownload_file(self, remote_filepath: str, local_filepath: str) -> None:
            self._asked.setdefault(local_filepath, time.perf_counter_ns())
            await super().adownload_file(remote_filepath, local_filepath)

        def _publish_file(self, tmp_path: str, local_filepath: str) -> None:
            size = os.path.getsize(tmp_path)
            asked = self._asked.pop(local_filepath, None)
            super()._publish_file(tmp_path, local_filepath)
            # Not the index, which the main process fetches once before the epoch (its forked
            # workers would each count it again).
            if asked is not None and not local_filepath.endswith(litdata_format.INDEX):
                with _downloads_lock:
                    _downloads.append((size, time.perf_counter_ns() - asked))

    register_downloader("s3://", CountingS3Downloader, overwrite=True)
    return CountingS3Downloader


def _allow_plain_http(endpoint: client.Endpoint) -> None:
    """Let LitData's obstore path reach an http:// endpoint (a local server, MinIO): LitData
    builds its obstore S3Store with fixed client options that lack allow_http, so every chunk
    GET there fails with "builder error" (its boto3 path, used for index.json, works). The
    option is added to those (litdata==0.2.76, as pinned) only for such an endpoint."""
    if not endpoint.address.startswith("http://"):
        return
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if not isinstance(options, dict):
        raise ConfigError(
            f"this litdata ({downloader.__name__}) keeps its obstore options elsewhere; "
            f"storage.endpoint={endpoint.address} needs them to allow http. Install the pinned "
            'version: pip install -e ".[litdata]", or use an https endpoint'
        )
    downloader._OBSTORE_CLIENT_OPTIONS = {**options, "allow_http": "true"}


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
            _take_downloads()
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
    _counting_downloader()
    endpoint = client.configured()
    _allow_plain_http(endpoint)
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
)
