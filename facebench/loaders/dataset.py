"""The seed's first pipeline: a map-style Dataset per source, concatenated, shuffled by index.

Every sample is a random access to one small file: open, decode, crop, transform.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.utils.data import ConcatDataset, Dataset

from facebench.config import LoaderConfig
from facebench.data.images import open_sample
from facebench.data.sources import Record, celeba_records, digiface_records
from facebench.loaders import base
from facebench.loaders.base import (
    Batch,
    LoaderContext,
    data_loader,
    distributed_sampler,
    usable,
)

Options = LoaderConfig


class RecordDataset(Dataset):
    """One source's samples by index, as the seed's CelebADataset and DigiFace1M classes."""

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
    celeba = RecordDataset(usable(celeba_records(ctx.data_root, ctx.labels), ctx), ctx.transform)
    digiface = RecordDataset(
        usable(digiface_records(ctx.data_root, ctx.labels), ctx), ctx.transform, len(celeba)
    )
    dataset = ConcatDataset([celeba, digiface])
    sampler = distributed_sampler(dataset, ctx) if ctx.world.distributed else None
    return data_loader(dataset, ctx, shuffle=True, sampler=sampler)
