"""Lance: random access by row, the format taken up for multimodal training (prepare.py
format=lance, a Lance dataset of the encoded images with their ids and labels).

    Takes(dataset) -> DataLoader(sampler: the epoch plan's order as row numbers, batch_size,
    n_workers) -> each batch one dataset.take(rows) in a worker -> decoded with loader.decoder

Each batch's rows are fetched in one take, which reads only those rows' pages, wherever they
are: no shard is scanned and no shuffle buffer is needed, the order is a full permutation as
the dataset loader's. Lance's own torch dataset (lance.torch.data.LanceDataset) was not used: it
deals whole fragments or batches to workers and shuffles within them, not a permutation of the
epoch.

Lance is not fork-safe (its Rust runtime does not survive a fork: a worker forked from a
process that had opened a dataset crashed on its first take), so the workers are started by
multiprocessing's forkserver, a clean process started once per job before the clock (set_up)
with torch and this module loaded; each worker opens the dataset itself.

With storage=s3 the dataset is where prepare.py storage=s3 uploaded it, and Lance reads it
through its own S3 client (the Rust object_store crate), given the job's endpoint, addressing and
credentials. Lance reports its reads, not their times: each batch's are counted as GETs (from
dataset.io_stats_incremental) with the take's whole time as each one's latency.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from facebench import stages
from facebench.config import Decoder, LoaderConfig
from facebench.data.images import max_pixels, set_max_pixels
from facebench.errors import ShardError
from facebench.host import forkserver
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders.columnar import DecodeRows, Rows, RowSampler, row_numbers
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shardsets import (
    OpenShardSet,
    ShardGuard,
    ensure_loader_shards,
    open_shard_set,
)
from facebench.loaders.shared import Batch, LoaderContext, data_loader
from facebench.loaders.spec import LoaderSpec, decoder_traits
from facebench.shards import lance_format
from facebench.shards.lance_format import open_dataset, storage_options
from facebench.shards.parquet_format import COLUMNS

REBUILD = "python prepare.py format=lance"
# Worker processes start from a clean process (see the module's docstring).
START_METHOD = "forkserver"


@dataclass
class Options(LoaderConfig):
    # torchvision: torchvision.io + batched tensor transforms; pil: the article's PIL transform.
    decoder: Decoder = Decoder.torchvision


class Takes(Dataset):
    """The dataset's rows, a batch at a time (DataLoader's `__getitems__`): one take, timed
    as the read stage, as a Rows for DecodeRows. Opened in each worker on its first batch (its
    opening's reads counted with that batch). A take that fails is named in one line, as a
    damaged set or one rebuilt during the run (the guard tells them apart)."""

    def __init__(self, options: dict[str, str] | None, n_rows: int, guard: ShardGuard) -> None:
        self.options = options
        self.n_rows = n_rows
        self.guard = guard
        self._dataset: Any = None

    def __len__(self) -> int:
        return self.n_rows

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dataset": None}  # each process opens its own

    def __getitems__(self, rows: list[int]) -> Rows:
        uri = str(self.guard.folder)
        start = stages.now()
        if self._dataset is None:
            self._dataset = open_dataset(uri, self.options)
        try:
            with self.guard.reading(uri):
                table = self._dataset.take(rows, columns=list(COLUMNS))
        except (ValueError, RuntimeError) as error:  # pylance's other errors
            raise ShardError(
                f"{uri}: Lance could not read rows ({error}). Rebuild: {REBUILD}"
            ) from None
        if self.options is not None:  # a bucket's: each read a GET
            _count_gets(self._dataset.io_stats_incremental(), stages.now()[0] - start[0])
        stages.lap(stages.READ, start)
        return Rows(
            table.column("id").to_pylist(),
            table.column("label").to_pylist(),
            table.column("source").to_pylist(),
            table.column("path").to_pylist(),
            table.column("image").to_pylist(),
            [f"row {row}" for row in rows],
        )


def _count_gets(read: Any, elapsed_ns: int) -> None:
    """Lance's reads since the last count, each a GET: its share of the bytes (the first
    takes the remainder), the take's whole time as its latency (Lance reports no times)."""
    share, extra = divmod(read.read_bytes, max(read.read_iops, 1))
    for index in range(read.read_iops):
        stages.fetched(share + (extra if index == 0 else 0), elapsed_ns, elapsed_ns, 0, 0)


class InWorkers:
    """A worker_init_fn: what a worker started from the forkserver does not inherit from the
    job: its stage timing and its data.max_pixels."""

    def __init__(self) -> None:
        self.timing = stages.timing()
        self.max_pixels = max_pixels()

    def __call__(self, worker_id: int) -> None:
        stages.set_timing(self.timing)
        set_max_pixels(self.max_pixels)


_rows: dict[tuple[str, str], np.ndarray] = {}  # each set's row numbers, read once per process


def _row_numbers(ctx: LoaderContext, check: bool) -> tuple[OpenShardSet, np.ndarray]:
    """The set (checked, where `check`: its version, format and schema) and its rows' sample
    ids as the epoch plan's row numbers, read once (the whole id column: from a bucket, GETs)."""
    shard_set = open_shard_set(ctx, check=check)
    key = (str(shard_set.folder), shard_set.guard.digest)
    if key not in _rows:
        ids = open_dataset(key[0]).to_table(columns=["id"]).column("id").to_numpy()
        _rows[key] = row_numbers(ids, len(ctx.records), key[0])
    return shard_set, _rows[key]


def build(ctx: LoaderContext) -> Iterable[Batch]:
    shard_set, rows = _row_numbers(ctx, check=False)  # checked in set-up, before the clock
    uri = str(shard_set.folder)
    labels = np.array([record.label for record in ctx.records], dtype=np.int64)
    return data_loader(
        Takes(storage_options(uri), len(rows), shard_set.guard),
        ctx,
        sampler=RowSampler(ctx.plan, rows),
        collate=DecodeRows(DecodeStage.of(ctx), labels, uri, REBUILD),
        start_method=START_METHOD,
        worker_init=InWorkers(),
    )


def set_up(ctx: LoaderContext) -> dict[str, float]:
    """Once per job, before the clock: the dataset built if missing, checked, its rows'
    sample ids read; and the forkserver its workers start from running, with torch and this
    module loaded. Lance itself is loaded by each worker: a process that has loaded it warns at
    each fork."""
    metrics = ensure_loader_shards(ctx, "lance")
    _row_numbers(ctx, check=True)
    if ctx.n_workers > 0:
        forkserver.start(["torch", "torchvision", "pyarrow", __name__])
    return metrics


def worker_memory(ctx: LoaderContext) -> int:
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    shard_format=lance_format.FORMAT.name,
    set_up=set_up,
    requires=Requirement("lance", "lance"),
    bucket_refusal=None,
    own_client="object_store (Rust), Lance's own",
)
