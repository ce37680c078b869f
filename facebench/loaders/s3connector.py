"""AWS's s3torchconnector: its `S3MapDataset` over the images in a bucket, in a DataLoader, as its
README shows it (the one users reach for first). Reads a bucket only (storage=s3).

    S3MapDataset.from_objects([s3://bucket/prefix/..., ...], region, endpoint, transform)
      -> DataLoader(sampler=the epoch plan, num_workers=n_workers)

The objects are the job's listing (the same samples and order as every loader); each item is
one GET made by the library's CRT client, one at a time per worker, as the library does it (no
requests in flight beside it: compare `loader=dataset`, which keeps storage.requests_per_worker
GETs in flight). Retries are the library's own (storage.attempts), not counted apart; each GET
is counted in storage_* with its whole read as its latency (the library hides its first byte).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from facebench import stages
from facebench.config import Decoder, LoaderConfig
from facebench.data.records import Record
from facebench.host.extras import Requirement
from facebench.loaders import shared
from facebench.loaders.decoding import DecodeStage
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


@dataclass
class Options(LoaderConfig):
    # pil: the article's PIL transform per sample; fast or torchvision: uint8 samples.
    decoder: Decoder = Decoder.pil


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


def _map_dataset(paths: list[str]) -> Any:
    from s3torchconnector import S3ClientConfig, S3MapDataset

    endpoint = client.configured()
    config = S3ClientConfig(
        force_path_style=endpoint.path_style,
        max_attempts=endpoint.attempts,
        profile=endpoint.profile or None,
    )
    return S3MapDataset.from_objects(
        paths,
        region=endpoint.region,
        endpoint=endpoint.endpoint or None,
        transform=_Read(),
        s3client_config=config,
    )


def worker_memory(ctx: LoaderContext) -> int:
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized)


def build(ctx: LoaderContext) -> Iterable[Batch]:
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
    bucket_refusal=None,
    local_refusal="it reads from a bucket only: add storage=s3 storage.url=s3://bucket/prefix",
)
