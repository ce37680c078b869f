"""The article's first pipeline: a map-style Dataset per source, concatenated, shuffled by index.

Every sample is a random access to one small file: open, decode, crop, transform.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.utils.data import ConcatDataset, Dataset

from facebench.config import LoaderConfig
from facebench.data.images import open_sample
from facebench.data.sources import Record, records_by_source
from facebench.loaders import base
from facebench.loaders.base import (
    Batch,
    LoaderContext,
    data_loader,
    distributed_sampler,
    usable,
)
from facebench.loaders.spec import LoaderSpec


class RecordDataset(Dataset):
    """One source's samples by index, as the article's CelebADataset and DigiFace1M classes."""

    def __init__(self, records: list[Record], transform: Callable, first_id: int = 0) -> None:
        self.records = records
        self.transform = transform
        self.first_id = first_id  # canonical position of records[0]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        record = self.records[index]
        image = self.transform(open_sample(record.path, record.source))
        return image, record.label, self.first_id + index


def worker_memory(ctx: LoaderContext) -> int:
    return base.worker_memory(ctx)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    # One Dataset per source (CelebA, DigiFace1M; or the folder's), listed here inside the clock.
    parts: list[RecordDataset] = []
    for records in records_by_source(ctx.data_root, ctx.labels, ctx.layout):
        first_id = sum(len(part) for part in parts)
        parts.append(RecordDataset(usable(records, ctx), ctx.transform, first_id))
    dataset = ConcatDataset(parts)
    sampler = distributed_sampler(dataset, ctx) if ctx.world.distributed else None
    return data_loader(dataset, ctx, shuffle=True, sampler=sampler)


LOADER = LoaderSpec(options=LoaderConfig, build=build, worker_memory=worker_memory)
