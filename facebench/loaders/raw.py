"""Pre-decoded samples in fixed-size records: read a batch's bytes, hand them over, done.

prepare.py (format=raw) stores each sample once, decoded and resized to 112x112 (the article's only
deterministic step), as fixed-size uint8 records in .npy shards. Each epoch draws one permutation
of all samples (the epoch plan's, the same on every rank), cuts it into batches, and deals batch
b to rank b % world_size: a full shuffle, no decoding, no pickle, nothing loaded whole. The batch
leaves as uint8 with its crop offsets; the device crops and normalizes it (facebench.run.finish).

Where the gathering runs was measured (20,000 samples, batch 600, warm, 2 cores): reading each
sample's 37,632 bytes with pread into the batch runs at 120,000-130,000 images/s in one thread,
against 55,000-60,000 for fancy indexing a memory map opened per batch (page faults) and
15,000-27,000 with two DataLoader worker processes, where moving a 22 MB batch between processes
costs more than gathering it. So batches are gathered by threads of this process: n_workers of
them, each reading whole batches (pread releases the GIL), prefetch_factor batches ahead per
thread; n_workers=0 gathers in the loop itself. A batch's samples are read in file order (its
set of samples is the shuffled one; only their order within the batch is sorted), and on a GPU
straight into pinned memory, from which the copy to the device does not wait.

The shard files are opened once per epoch and checked against the manifest the run started
with; an open file keeps its bytes even if prepare.py replaces it meanwhile, so an epoch never
mixes two shard sets.

From a bucket (storage=s3, the set prepare.py storage=s3 format=raw uploads), each sample is a
range GET of its 37,632 bytes (its position in the shard is known: no listing, no header but
each shard's, read once an epoch), storage.requests_per_worker of them in flight per gathering
thread. A batch's samples are scattered over the whole set, so ranges rarely touch: nothing is
coalesced. The GETs are counted with the batch of the thread that gathered them.
"""

from __future__ import annotations

import io
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import torch

from facebench import stages
from facebench.config import LoaderConfig, Workers
from facebench.data.images import counted
from facebench.errors import ObjectMissing, ShardError
from facebench.host.resources import batch_bytes
from facebench.loaders.shardsets import OpenShardSet, open_shard_set
from facebench.loaders.shared import Batch, LoaderContext, stamped
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits
from facebench.shards import raw_format
from facebench.shards.manifest import entry_path, missing_shard, read_index
from facebench.storage import client


class RawBatches:
    """One epoch's batches, gathered from the shard files in one shuffled order."""

    def __init__(self, ctx: LoaderContext, shard_set: OpenShardSet) -> None:
        self.folder = shard_set.folder
        self.shards = shard_set.manifest.shards
        self.guard = shard_set.guard
        index = np.concatenate([read_index(self.folder, shard) for shard in self.shards])
        self.labels = np.ascontiguousarray(index["label"])  # verified against the manifest
        self.ids = np.ascontiguousarray(index["id"])
        self.starts = np.concatenate([[0], np.cumsum([s.samples for s in self.shards])])
        # The shards hold the samples in canonical positions' stead: the plan's positions index
        # the shards' records (a full permutation either way).
        self.plan = replace(ctx.plan, n_samples=int(self.starts[-1]))
        self.resize = ctx.geometry.resize  # what the job's preparation built the shards with
        self.pin = ctx.pin_memory
        self.n_threads = ctx.n_workers
        self.ahead = max(1, ctx.n_workers) * ctx.options.prefetch_factor
        # From a bucket, while an epoch runs: the shards' addresses and the pool of GETs.
        self.gets: tuple[list[str], ThreadPoolExecutor] | None = None

    def __len__(self) -> int:
        return self.plan.n_batches  # whole batches, the same number for every rank

    def __iter__(self) -> Iterator[Batch]:
        if isinstance(self.folder, str):
            yield from self._from_bucket()
            return
        files = self._open()
        try:
            mine = self.plan.batches()
            if self.n_threads == 0:
                for positions in mine:
                    yield self._batch(files, positions)
                return
            yield from self._threaded(files, mine)
        finally:
            for fd in files:
                os.close(fd)

    def _threaded(self, files: list[int], mine: Iterator[np.ndarray]) -> Iterator[Batch]:
        """Batches in order, gathered by n_threads threads up to `ahead` batches in advance."""
        pending: deque[Future] = deque()
        with ThreadPoolExecutor(self.n_threads, thread_name_prefix="raw-gather") as pool:
            try:
                for positions in mine:
                    pending.append(pool.submit(self._batch, files, positions))
                    if len(pending) >= self.ahead:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    def _from_bucket(self) -> Iterator[Batch]:
        urls = [str(entry_path(self.folder, shard.name)) for shard in self.shards]
        self.data_starts = [self._header_end(url) for url in urls]
        in_flight = client.configured().in_flight * max(1, self.n_threads)
        with ThreadPoolExecutor(in_flight, thread_name_prefix="raw-get") as pool:
            self.gets = (urls, pool)
            try:
                mine = self.plan.batches()
                if self.n_threads == 0:
                    for positions in mine:
                        yield self._batch([], positions)
                    return
                yield from self._threaded([], mine)
            finally:
                self.gets = None

    def _header_end(self, url: str) -> int:
        """Where a shard object's images start, from a range GET of its header."""
        size = next(shard.bytes for shard in self.shards if url.endswith(f"/{shard.name}"))
        reply = self._get(url, (0, min(size, raw_format.HEADER_BYTES)))  # not counted: once
        return raw_format.header_end(io.BytesIO(reply.data), url, self.resize)

    def _get(self, url: str, byte_range: tuple[int, int]) -> client.Reply:
        try:
            return client.get(url, byte_range)
        except ObjectMissing:
            with self.guard.reading(url):  # a set rebuilt meanwhile says so
                raise missing_shard(url) from None

    def _open(self) -> list[int]:
        """Each shard's file, checked against the manifest; where its images start."""
        files = []
        self.data_starts = []
        try:
            for shard in self.shards:
                path = self.folder / shard.name
                with self.guard.reading(path):
                    fd = os.open(path, os.O_RDONLY)
                    files.append(fd)
                    if os.fstat(fd).st_size != shard.bytes:
                        raise ShardError(f"{path}: not the size its manifest records")
                    self.data_starts.append(raw_format.data_offset(fd, str(path), self.resize))
            # The indexes were read a moment ago: the files just opened must be the same set.
            with self.guard.reading(self.folder):
                if self.guard.changed():
                    raise ShardError(f"{self.folder}: changed while opening")
        except BaseException:
            for fd in files:
                os.close(fd)
            raise
        return files

    def _batch(self, files: list[int], positions: np.ndarray) -> Batch:
        start = stages.now()
        chosen = np.sort(positions)
        images = torch.empty(
            (len(chosen), *raw_format.shape(self.resize)), dtype=torch.uint8, pin_memory=self.pin
        )
        self._gather(files, chosen, images.numpy())
        start = stages.lap(stages.READ, start)
        ids = torch.from_numpy(self.ids[chosen])
        labels = torch.from_numpy(self.labels[chosen])
        # Crop offsets per batch, as every loader draws them: whichever thread gathers it.
        return stamped(Batch(images, labels, ids, self.plan.offsets(ids)), start)

    def _gather(self, files: list[int], positions: np.ndarray, out: np.ndarray) -> None:
        """Read the samples at these (sorted) global positions into out, one pread each (one
        range GET each, from a bucket)."""
        if self.gets is not None:
            short = self._gather_objects(positions, out)
        else:
            short = raw_format.gather(files, self.data_starts, self.starts, positions, out)
        if short is not None:
            raise ShardError(
                f"{entry_path(self.folder, self.shards[short].name)}: shorter than recorded"
            )

    def _gather_objects(self, positions: np.ndarray, out: np.ndarray) -> int | None:
        urls, pool = self.gets
        record = out[0].nbytes
        rows = out.reshape(len(positions), record)
        shard_of = np.searchsorted(self.starts, positions, side="right") - 1
        offsets = (
            np.asarray(self.data_starts)[shard_of] + (positions - self.starts[shard_of]) * record
        )
        wanted = [
            (urls[s], (o, o + record))
            for s, o in zip(shard_of.tolist(), offsets.tolist(), strict=True)
        ]
        replies = list(pool.map(lambda get: self._get(*get), wanted))
        for row, reply, shard in zip(rows, replies, shard_of.tolist(), strict=True):
            counted(reply)  # in this thread: with the batch it gathers
            if len(reply.data) != record:
                return shard
            row[:] = np.frombuffer(reply.data, dtype=np.uint8)
        return None


def worker_memory(ctx: LoaderContext) -> int:
    """Threads, not processes: only the uint8 batches gathered ahead."""
    ahead = max(1, ctx.n_workers) * ctx.options.prefetch_factor
    return (
        ahead
        * batch_bytes(ctx.batch_size, raw_format.shape(ctx.geometry.resize), normalized=False)
        // max(1, ctx.n_workers)
    )


def build(ctx: LoaderContext) -> RawBatches:
    return RawBatches(ctx, open_shard_set(ctx))


LOADER = LoaderSpec(
    options=LoaderConfig,
    build=build,
    worker_memory=worker_memory,
    traits=Traits(Handover.uint8, Pixels.exact, Workers.thread),
    shard_format="raw",
    bucket_refusal=None,
)
