"""Parquet through Hugging Face datasets, as users read image sets from the Hub: the shards of
prepare.py format=parquet (encoded images, ids, labels, in row groups of row_group_size).

loader.mode=map (the default):

    load_dataset("parquet", data_files) -> Dataset.with_format("torch", ids and labels) ->
    DataLoader(shuffled sampler, batch_size, n_workers) -> each batch's rows fetched at once
    (dataset[rows]), then decoded with loader.decoder in the workers

datasets reads the files once into an Arrow copy (in data.cache_dir/hf-datasets/, before the
clock: `parquet_arrow_s`; used only while the set's files are those that made it: shards/
copies.py), memory-mapped and indexed at random: the epoch reads that copy, not the Parquet
files, so `cache=` warms or evicts it. The order is the epoch plan's, as row numbers.

loader.mode=streaming:

    load_dataset(..., streaming=True) -> split by rank -> .shuffle(seed, buffer_size=
    loader.shuffle_buffer) -> DataLoader(batch_size, n_workers): each worker reads whole files,
    a row group at a time, and batches its own samples (one partial batch each may be dropped)

With storage=s3 the files are where prepare.py storage=s3 uploaded them, and datasets reads
them through its own S3 client, s3fs (fsspec), given the job's endpoint (loaders/
parquet_bucket.py): a stream's reads are ranged GETs, the map mode's copy is downloaded in
set-up. Each GET is counted in the storage_* metrics.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from facebench import stages
from facebench.config import Decoder, LoaderConfig, ParquetMode
from facebench.errors import ShardError
from facebench.host.extras import Requirement
from facebench.loaders import parquet_bucket, shared
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
from facebench.shards import copies, parquet_format

log = logging.getLogger(__name__)
REBUILD = "python prepare.py format=parquet"


@dataclass
class Options(LoaderConfig):
    # map: a map-style Dataset read at random; streaming: an IterableDataset, file after file.
    mode: ParquetMode = ParquetMode.map
    # streaming: samples each worker shuffles after reading them from its files.
    shuffle_buffer: int = 1000
    # torchvision: torchvision.io + batched tensor transforms; pil: the article's PIL transform.
    decoder: Decoder = Decoder.torchvision


def _features() -> Any:
    """The set's columns as datasets types: given, so that it reads no file's schema (a GET
    more from a bucket); each file's footer was checked in set-up."""
    from datasets import Features, Value

    return Features(
        {
            "id": Value("int64"),
            "label": Value("int64"),
            "source": Value("string"),
            "path": Value("binary"),
            "image": Value("binary"),
        }
    )


def _load(shard_set: OpenShardSet, cache: str, streaming: bool) -> Any:
    """datasets.load_dataset over the set's files; one line naming the set if it cannot."""
    import datasets
    from datasets.exceptions import DatasetsError

    datasets.logging.set_verbosity_error()  # its progress bars and notices, not facebench's
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(
            "parquet",
            data_files=shard_set.paths(),
            split="train",
            features=_features(),
            cache_dir=cache,
            streaming=streaming,
            storage_options=parquet_bucket.storage_options(shard_set.folder),
        )
    except (OSError, ValueError, DatasetsError) as error:  # ArrowInvalid is a ValueError
        cause = error.__cause__ or error  # datasets wraps what failed while it wrote its copy
        said = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
        into, room = "", ""
        if not streaming:
            into = f" into its Arrow copy in {cache}"
            room = f"If {cache} is full, make room or set data.cache_dir; "
        raise ShardError(
            f"{shard_set.folder}: Hugging Face datasets could not read these Parquet files"
            f"{into} ({said}). {room}if the files are damaged, rebuild: {REBUILD}"
        ) from None


_copies: dict[tuple[Path, str], tuple[str, Any]] = {}  # per set: what made its copy, the copy


def arrow_copy(ctx: LoaderContext, shard_set: OpenShardSet, check_files: bool = True) -> Any:
    """The map mode's Dataset: datasets' Arrow copy of the set as its files are now, made where
    there is none or the set changed since (shards/copies.py). check_files false: the copy
    set-up checked in this process (in the clock, a bucket's listing would cost a request)."""
    key = (ctx.cache, shard_set.guard.digest)
    if not check_files and key in _copies:
        return _copies[key][1]
    copy = copies.copy_for(ctx.cache / copies.ARROW_COPIES, shard_set.folder, shard_set.manifest)
    made_from = json.dumps(copy.made_from)
    if key not in _copies or _copies[key][0] != made_from:
        with copy.making():
            copy.renew()
            _copies[key] = (made_from, _load(shard_set, str(copy.folder), streaming=False))
            copy.made()
    return _copies[key][1]


class TimedRows(Dataset):
    """The Dataset's rows, a batch at a time (DataLoader's `__getitems__`): `dataset[rows]`,
    timed as the read stage, as a Rows for DecodeRows. Each row's place is named by its file."""

    def __init__(self, table: Any, names: list[str], starts: list[int]) -> None:
        self.table = table
        self.names = names
        self.starts = starts  # each file's first row

    def __len__(self) -> int:
        return len(self.table)

    def where(self, row: int) -> str:
        shard = bisect.bisect_right(self.starts, row) - 1
        return f"row {row - self.starts[shard]} of {self.names[shard]}"

    def __getitems__(self, rows: list[int]) -> Rows:
        start = stages.now()
        columns = self.table[rows]
        parquet_bucket.take_gets()
        stages.lap(stages.READ, start)
        return Rows(
            columns["id"].tolist(),
            columns["label"].tolist(),
            columns["source"],
            columns["path"],
            columns["image"],
            [self.where(row) for row in rows],
        )


class Stream(IterableDataset):
    """A datasets IterableDataset, each sample's arrival timed as the read stage. datasets
    deals its files among the DataLoader's workers itself. A file that cannot be read is named
    as a damaged shard, or as a set rebuilt during the run (the guard tells them apart)."""

    def __init__(self, stream: Any, guard: ShardGuard) -> None:
        self.stream = stream
        self.guard = guard

    def __iter__(self) -> Iterator[dict]:
        items = iter(self.stream)
        while True:
            start = stages.now()
            try:
                with self.guard.reading(str(self.guard.folder)):
                    item = next(items)
            except StopIteration:
                return
            except ValueError as error:  # pyarrow's ArrowInvalid: bytes that are no Parquet
                raise ShardError(
                    f"{self.guard.folder}: a Parquet file could not be read ({error}). "
                    f"Rebuild: {REBUILD}"
                ) from None
            parquet_bucket.take_gets()
            stages.lap(stages.READ, start)
            yield item


class CollateStream:
    """A worker's streamed samples -> one Batch."""

    def __init__(self, decode: DecodeRows) -> None:
        self.decode = decode

    def __call__(self, items: list[dict]) -> Batch:
        ids = [int(item["id"]) for item in items]
        return self.decode(
            Rows(
                ids,
                [int(item["label"]) for item in items],
                [item["source"] for item in items],
                [item["path"] for item in items],
                [item["image"] for item in items],
                [f"sample {sample_id}" for sample_id in ids],
            )
        )


def _decode_rows(ctx: LoaderContext, shard_set: OpenShardSet) -> DecodeRows:
    labels = np.array([record.label for record in ctx.records], dtype=np.int64)
    return DecodeRows(DecodeStage.of(ctx), labels, str(shard_set.folder), REBUILD)


def _build_map(ctx: LoaderContext, shard_set: OpenShardSet) -> Iterable[Batch]:
    table = arrow_copy(ctx, shard_set, check_files=False)  # checked in set-up
    parquet_format.check_columns(table, str(shard_set.folder))
    rows = row_numbers(np.asarray(table["id"]), len(ctx.records), str(shard_set.folder))
    shards = shard_set.manifest.shards
    starts = np.concatenate([[0], np.cumsum([shard.samples for shard in shards])[:-1]])
    # The torch format for ids and labels only: it turns a binary column into numpy bytes,
    # which drop an image's trailing zero bytes (a WebP ending in padding no longer decodes).
    torch_ids = table.with_format("torch", columns=["id", "label"], output_all_columns=True)
    timed = TimedRows(torch_ids, [s.name for s in shards], starts.tolist())
    sampler = RowSampler(ctx.plan, rows)
    return data_loader(timed, ctx, sampler=sampler, collate=_decode_rows(ctx, shard_set))


def _build_streaming(ctx: LoaderContext, shard_set: OpenShardSet) -> Iterable[Batch]:
    from datasets.distributed import split_dataset_by_node

    options: Options = ctx.options
    stream = _load(shard_set, str(ctx.cache / "hf-datasets"), streaming=True)
    parquet_format.check_columns(stream, str(shard_set.folder))
    if ctx.world.world_size > 1:
        stream = split_dataset_by_node(stream, ctx.world.rank, ctx.world.world_size)
    stream = stream.shuffle(seed=ctx.plan.seed % 2**32, buffer_size=options.shuffle_buffer)
    # Python objects, not the torch format, which drops trailing zero bytes (_build_map).
    timed = Stream(stream, shard_set.guard)
    collate = CollateStream(_decode_rows(ctx, shard_set))
    return data_loader(timed, ctx, collate=collate)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    shard_set = open_shard_set(ctx, check=False)  # checked in set-up, before the clock
    if ctx.options.mode == ParquetMode.streaming:
        return _build_streaming(ctx, shard_set)
    return _build_map(ctx, shard_set)


def set_up(ctx: LoaderContext) -> dict[str, float]:
    """Once per job: the shards built if missing; in map mode, datasets' Arrow copy made (or
    found) before the clock, with the GETs a copy from a bucket took."""
    metrics = ensure_loader_shards(ctx, "parquet")
    parquet_bucket.counting()
    shard_set = open_shard_set(ctx)  # each file's footer checked, before the clock
    if ctx.options.mode == ParquetMode.map:
        started = time.perf_counter()
        arrow_copy(ctx, shard_set)
        metrics["parquet_arrow_s"] = time.perf_counter() - started
        metrics.update(parquet_bucket.set_up_gets())
    return metrics


def epoch_files(ctx: LoaderContext) -> list[str]:
    """The files an epoch reads: datasets' Arrow copy in map mode, else the Parquet files."""
    if ctx.options.mode == ParquetMode.map:
        copy = arrow_copy(ctx, open_shard_set(ctx, check=False), check_files=False)
        return [found["filename"] for found in copy.cache_files]
    return []  # the shards' own: LoaderSpec.data_files


def worker_memory(ctx: LoaderContext) -> int:
    held = 0  # streaming: its buffer, and a row group being read
    if ctx.options.mode == ParquetMode.streaming:
        held = (ctx.options.shuffle_buffer + ctx.row_group_size) * 32 * 2**10
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized, held=held)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    shard_format="parquet",
    # Streaming: each worker batches the files it reads; map: batched in one place.
    batches_per_worker=lambda options: options.mode == ParquetMode.streaming,
    set_up=set_up,
    epoch_files=epoch_files,
    requires=Requirement("datasets", "parquet"),
    bucket_refusal=None,
    own_client="s3fs (fsspec), Hugging Face datasets' own",
)
