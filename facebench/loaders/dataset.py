"""The article's first pipeline: a map-style Dataset per source, concatenated, shuffled by index.

Every sample is a random access to one small file: open, decode, crop, transform. As in the
article, the Datasets are made from the listing before the clock starts; the DataLoader's
shuffle is the epoch plan's order (facebench/loaders/plan.py), a full permutation as
`shuffle=True` draws.

`loader.decoder=pil` (the default) is the article's own path: PIL and its per-sample transform.
`loader.decoder=fast` (or `torchvision`) decodes with the faster libraries and hands over uint8
samples that the device crops and normalizes per batch (facebench.run.finish).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils.data import ConcatDataset, Dataset

from facebench.config import Decoder, LoaderConfig
from facebench.data.records import Record
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
from facebench.storage.address import in_bucket


@dataclass
class Options(LoaderConfig):
    # pil: the article's PIL transform per sample; fast or torchvision: uint8 samples.
    decoder: Decoder = Decoder.pil


class RecordDataset(Dataset):
    """One source's samples by index, as the article's CelebADataset and DigiFace1M classes."""

    def __init__(self, records: list[Record], stage: DecodeStage, first_id: int = 0) -> None:
        self.records = records
        self.stage = stage
        self.first_id = first_id  # canonical position of records[0]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        record = self.records[index]
        return self.stage.from_file(record), record.label, self.first_id + index


class BucketDataset(RecordDataset):
    """Every sample of data in a bucket, by its canonical position. DataLoader asks for a
    batch's indices at once (`__getitems__`), so that each worker keeps
    storage.requests_per_worker GETs in flight: what users do for object stores
    (pytorch#158218), where one GET at a time leaves a worker waiting out each latency."""

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int, int]]:
        records = [self.records[index] for index in indices]
        samples = self.stage.samples(records)
        return [
            (sample, record.label, index)
            for sample, record, index in zip(samples, records, indices, strict=True)
        ]


def worker_memory(ctx: LoaderContext) -> int:
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    # One Dataset per source (CelebA, DigiFace1M; or the folder's), in canonical order.
    parts: list[RecordDataset] = []
    stage = DecodeStage.of(ctx)
    collate = collate_samples if stage.normalized else CollateUint8(ctx.plan)
    sampler = PlanSampler(ctx.plan)
    if ctx.records and in_bucket(ctx.records[0].path):
        return data_loader(BucketDataset(ctx.records, stage), ctx, sampler=sampler, collate=collate)
    for _, records in itertools.groupby(ctx.records, key=lambda record: record.source):
        first_id = sum(len(part) for part in parts)
        parts.append(RecordDataset(list(records), stage, first_id))
    return data_loader(ConcatDataset(parts), ctx, sampler=sampler, collate=collate)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    bucket_refusal=None,
)
