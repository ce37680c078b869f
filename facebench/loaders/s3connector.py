"""AWS's s3torchconnector: its `S3MapDataset` over the images in a bucket, in a DataLoader, as its
README shows it (the one users reach for first), or its `S3IterableDataset` over the tar shards
(loader.reads=shards). Reads a bucket only (storage=s3).

    reads=images: S3MapDataset.from_objects([s3://bucket/prefix/..., ...], region, endpoint,
      transform) -> DataLoader(sampler=the epoch plan, num_workers=n_workers)
    reads=shards: S3IterableDataset.from_objects(the tars, this epoch's order, enable_sharding)
      -> webdataset's tar expansion -> shuffle buffer -> decode -> batches, in each worker

The objects are the job's listing (the same samples and order as every loader); each item is
one GET made by the library's CRT client, one at a time per worker, as the library does it (no
requests in flight beside it: compare `loader=dataset`, which keeps storage.requests_per_worker
GETs in flight). Retries are the library's own (storage.attempts), not counted apart; each GET
is counted in storage_* with its whole read as its latency (the library hides its first byte).

With reads=shards the tars are those prepare.py storage=s3 format=tar uploads. The library
deals them to ranks and workers (enable_sharding) and streams each (its S3Reader, read as the
tar is parsed: nothing held whole); the samples go on as in loader=webdataset (its label check,
decoding and batching), which is how AWS's examples pair the two. Each tar is one GET, counted
once its samples are taken, with the time to its first byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import Dataset, IterableDataset
from webdataset.tariterators import group_by_keys, tar_file_expander

from facebench import stages
from facebench.config import Decoder, LoaderConfig
from facebench.data.records import Record
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders import webdataset as tars
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shardsets import open_shard_set
from facebench.loaders.shared import (
    Batch,
    CollateUint8,
    LoaderContext,
    PlanSampler,
    collate_samples,
    data_loader,
)
from facebench.loaders.spec import LoaderSpec, decoder_traits
from facebench.storage import client

# "Building S3MapDataset from_objects" at INFO, every epoch: the run's own lines say it.
logging.getLogger("s3torchconnector").setLevel(logging.WARNING)


class Reads(StrEnum):
    images = "images"  # S3MapDataset: one GET per image
    shards = "shards"  # S3IterableDataset: the tar shards of prepare.py storage=s3 format=tar


@dataclass
class Options(LoaderConfig):
    # pil: the article's PIL transform per sample; fast or torchvision: uint8 samples.
    decoder: Decoder = Decoder.pil
    # What it reads: each image (S3MapDataset), or the tar shards (S3IterableDataset).
    reads: Reads = Reads.images
    # reads=shards: samples each worker shuffles after reading them from its tars.
    shuffle_buffer: int = 1000


class _Read:
    """S3MapDataset's transform: the object's bytes, timed as the read stage and counted as one
    GET (picklable, for the workers)."""

    def __call__(self, reader: Any) -> bytes:
        start = stages.now()
        started = time.perf_counter_ns()
        data = reader.read()
        latency = time.perf_counter_ns() - started
        stages.fetched(len(data), latency, latency, 0, 0)
        stages.lap(stages.READ, start)
        return data


class ConnectorDataset(Dataset):
    """The S3MapDataset's items decoded as every loader decodes them, with their labels and ids."""

    def __init__(self, objects: Any, records: list[Record], stage: DecodeStage) -> None:
        self.objects = objects
        self.records = records
        self.stage = stage

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        record = self.records[index]
        data = self.objects[index]
        return self.stage.sample(data, record.source, record.path), record.label, index


def _library_options() -> dict[str, Any]:
    """The job's endpoint, as both datasets take it."""
    from s3torchconnector import S3ClientConfig

    endpoint = client.configured()
    config = S3ClientConfig(
        force_path_style=endpoint.path_style,
        max_attempts=endpoint.attempts,
        profile=endpoint.profile or None,
    )
    return {
        "region": endpoint.region,
        "endpoint": endpoint.address or None,
        "s3client_config": config,
    }


def _map_dataset(paths: list[str]) -> Any:
    from s3torchconnector import S3MapDataset

    return S3MapDataset.from_objects(paths, transform=_Read(), **_library_options())


class _Counted:
    """A tar's S3Reader as webdataset reads it: the GET's bytes, first byte and whole time."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.size = 0
        self.started = self.first_byte = self.ended = 0

    def read(self, size: int | None = -1) -> bytes:
        started = time.perf_counter_ns()
        data = self.reader.read(size)
        self.ended = time.perf_counter_ns()
        if not self.started:
            self.started, self.first_byte = started, self.ended - started
        self.size += len(data)
        return data

    def count(self) -> None:
        if self.started:
            stages.fetched(self.size, self.ended - self.started, self.first_byte, 0, 0)


class TarStreams(IterableDataset):
    """The library's S3IterableDataset over the tars, as webdataset's tar expansion takes them:
    {"url", "stream"}, each counted as one GET once its samples have been taken."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from s3torchconnector import S3IterableDataset

        tars = S3IterableDataset.from_objects(self.urls, enable_sharding=True, **_library_options())
        for reader in tars:  # this rank's and worker's share, in the epoch's order
            stream = _Counted(reader)
            yield {"url": f"s3://{reader.bucket}/{reader.key}", "stream": stream}
            stream.count()


def _build_shards(ctx: LoaderContext) -> Iterable[Batch]:
    options: Options = ctx.options
    shard_set = open_shard_set(ctx)
    stage = DecodeStage.of(ctx)
    plan = ctx.plan
    urls = shard_set.paths()
    urls = [urls[i] for i in np.random.default_rng(plan.seed).permutation(len(urls))]
    guard = shard_set.guard
    decode = tars.Decode(stage, False, shard_set.folder, shard_set.manifest.shards, guard)
    pipeline = wds.DataPipeline(
        TarStreams(urls),
        wds.pipelinefilter(tar_file_expander)(handler=tars.ReadFailure(guard)),
        wds.pipelinefilter(group_by_keys)(handler=tars.ReadFailure(guard)),
        stages.timed_items,  # getting each sample from the tars is the read stage
        wds.shuffle(options.shuffle_buffer, seed=plan.seed),
        wds.map(decode),
        wds.batched(ctx.batch_size, collation_fn=tars.Collate(stage, False, plan), partial=False),
    )
    return data_loader(pipeline, ctx, batched=True)


def _shard_format(options: LoaderConfig) -> str | None:
    return "tar" if getattr(options, "reads", Reads.images) == Reads.shards else None


def worker_memory(ctx: LoaderContext) -> int:
    # reads=shards: the shuffle buffer's encoded samples; a tar is streamed, never held whole.
    held = (
        ctx.options.shuffle_buffer * tars.ENCODED_SAMPLE_BYTES if _shard_format(ctx.options) else 0
    )
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized, held=held)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    if _shard_format(ctx.options) is not None:
        return _build_shards(ctx)
    stage = DecodeStage.of(ctx)
    objects = _map_dataset([record.path for record in ctx.records])
    collate = collate_samples if stage.normalized else CollateUint8(ctx.plan)
    dataset = ConnectorDataset(objects, ctx.records, stage)
    return data_loader(dataset, ctx, sampler=PlanSampler(ctx.plan), collate=collate)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    requires=Requirement("s3torchconnector", "s3"),
    shard_format=_shard_format,
    bucket_refusal=None,
    own_client="AWS's CRT client, s3torchconnector's",
    local_refusal="it reads from a bucket only: add storage=s3 storage.url=s3://bucket/prefix",
)
