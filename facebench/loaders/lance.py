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
from facebench.host import forkserver
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders.columnar import DecodeRows, Rows, RowSampler, row_numbers
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shardsets import ensure_loader_shards, open_shard_set
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
    as the read stage, as a Rows for DecodeRows. Opened in each worker on its first batch."""

    def __init__(self, uri: str, options: dict[str, str] | None, n_rows: int) -> None:
        self.uri = uri
        self.options = options
        self.n_rows = n_rows
        self._dataset: Any = None

    def __len__(self) -> int:
        return self.n_rows

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dataset": None}  # each process opens its own

    def __getitems__(self, rows: list[int]) -> Rows:
        if self._dataset is None:
            self._dataset = open_dataset(self.uri, self.options)
            self._dataset.io_stats_incremental()  # the opening's reads are not this batch's
        start = stages.now()
        table = self._dataset.take(rows, columns=list(COLUMNS))
        elapsed = stages.now()[0] - start[0]
        if self.options is not None:  # a bucket's: each read a GET
            read = self._dataset.io_stats_incremental()
            for _ in range(read.read_iops):
                stages.fetched(read.read_bytes // max(read.read_iops, 1), elapsed, elapsed, 0, 0)
        stages.lap(stages.READ, start)
        return Rows(
            table.column("id").to_pylist(),
            table.column("label").to_pylist(),
            table.column("source").to_pylist(),
            table.column("path").to_pylist(),
            table.column("image").to_pylist(),
            [f"row {row}" for row in rows],
        )


class TimingInWorkers:
    """A worker_init_fn: the parent's stage timing, in a worker that did not inherit it."""

    def __init__(self) -> None:
        self.on = stages.timing()

    def __call__(self, worker_id: int) -> None:
        stages.set_timing(self.on)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    shard_set = open_shard_set(ctx)  # opens the dataset: its version, format and schema
    uri = str(shard_set.folder)
    options = storage_options(uri)
    ids = open_dataset(uri, options).to_table(columns=["id"]).column("id").to_numpy()
    rows = row_numbers(ids, len(ctx.records), uri)
    labels = np.array([record.label for record in ctx.records], dtype=np.int64)
    collate = DecodeRows(DecodeStage.of(ctx), labels, uri, REBUILD)
    return data_loader(
        Takes(uri, options, len(ids)),
        ctx,
        sampler=RowSampler(ctx.plan, rows),
        collate=collate,
        start_method=START_METHOD,
        worker_init=TimingInWorkers(),
    )


def set_up(ctx: LoaderContext) -> dict[str, float]:
    """Once per job, before the clock: the dataset built if missing, and the forkserver its
    workers start from running, with torch and this module loaded. Lance itself is loaded by
    each worker: a process that has loaded it warns at each fork."""
    metrics = ensure_loader_shards(ctx, "lance")
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
