"""The seed's second pipeline, with the DataPipes built into torch (torchdata 0.10+ has none).

    IterableWrapper(CelebA records)
      .concat(FileLister(DigiFace1M, "*.png", recursive).map(to record))
      .shuffle(buffer_size)          # the seed's 100,000
      .batch(batch_size, drop_last)  # see below
      .sharding_filter()
      .load_images(transform)

Kept as the seed built it, costs included: every worker lists every file and fills its own
shuffle buffer of `shuffle_buffer` records before yielding anything (time to first batch, and a
buffer's worth of memory per worker), and only then drops what belongs to the other workers. The
DataLoader gives every worker the same shuffle seed, which is what lets sharding_filter split one
order among them without gaps or repeats.

One change: batches are formed before sharding_filter, not by the DataLoader in each worker. The
seed's way drops a partial batch per worker (up to n_workers * (batch_size - 1) samples an epoch;
on a small dataset, every sample). Formed here, only the epoch's one remainder is dropped, as in
loader=dataset. Each worker still decodes and transforms its samples and sends whole batches.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data.datapipes.datapipe import IterDataPipe
from torch.utils.data.datapipes.iter import FileLister, IterableWrapper

from facebench.config import LoaderConfig
from facebench.data.images import open_sample
from facebench.data.sample_index import SampleIndex
from facebench.data.sources import CELEBA, DIGIFACE, LabelSpace, celeba_records, digiface_record
from facebench.loaders import base
from facebench.loaders.base import Batch, LoaderContext, data_loader, usable

PipeRecord = tuple[str, int, str, int]  # path, label, source, sample id


@dataclass
class Options(LoaderConfig):
    # Records held by each worker's Shuffler; the seed's 100,000.
    shuffle_buffer: int = 100_000


class Keep:
    """What the other loaders list too: <DigiFace1M>/<folder>/<file>.png, one level down, less
    what on_bad_sample=skip left out (picklable, for the workers)."""

    def __init__(self, digiface: str, excluded: frozenset[str]) -> None:
        self.digiface = digiface
        self.excluded = excluded

    def __call__(self, path: str) -> bool:
        return os.path.dirname(os.path.dirname(path)) == self.digiface and path not in self.excluded


class DigiFaceRecord:
    """A DigiFace path from the FileLister -> (path, label, source, sample id)."""

    def __init__(self, labels: LabelSpace, ids: SampleIndex) -> None:
        self.labels = labels
        self.ids = ids

    def __call__(self, path: str) -> PipeRecord:
        record = digiface_record(path, self.labels)
        return record.path, record.label, record.source, self.ids(path)


class TakeFirst(IterDataPipe):
    """The first n items (torch's built-in DataPipes have no Header)."""

    def __init__(self, source_datapipe: IterDataPipe, n: int) -> None:
        self.source_datapipe = source_datapipe
        self.n = n

    def __iter__(self) -> Iterator:
        yield from itertools.islice(self.source_datapipe, self.n)


@torch.utils.data.functional_datapipe("load_images")
class ImageBatchLoader(IterDataPipe):
    """Decode and transform each batch of records; yield (images, labels, ids) tensors."""

    def __init__(self, source_datapipe: IterDataPipe, transform: Callable) -> None:
        self.source_datapipe = source_datapipe
        self.transform = transform

    def __iter__(self) -> Iterator[Batch]:
        for records in self.source_datapipe:
            images = torch.stack([self.transform(open_sample(p, s)) for p, _, s, _ in records])
            labels = torch.tensor([label for _, label, _, _ in records])
            ids = torch.tensor([sample_id for _, _, _, sample_id in records])
            yield Batch(images, labels, ids)


def build_datapipe(ctx: LoaderContext) -> IterDataPipe:
    options: Options = ctx.options
    celeba = [
        (r.path, r.label, r.source, i)
        for i, r in enumerate(usable(celeba_records(ctx.data_root, ctx.labels), ctx))
    ]
    n_celeba = len(celeba)
    ids = SampleIndex([r.path for r in ctx.records if r.source != CELEBA], offset=n_celeba)
    folder = str(Path(ctx.data_root) / DIGIFACE)
    digiface = FileLister(folder, masks="*.png", recursive=True).filter(Keep(folder, ctx.excluded))
    pipe = IterableWrapper(celeba, deepcopy=False).concat(
        digiface.map(DigiFaceRecord(ctx.labels, ids))
    )
    pipe = pipe.shuffle(buffer_size=options.shuffle_buffer)
    pipe = pipe.batch(ctx.batch_size, drop_last=True)
    if ctx.world.distributed:
        # The DataLoader splits batches across ranks, then workers; keeping a multiple of the
        # world size gives every rank the same number, so no rank waits for another's gradients.
        n_batches = len(ctx.records) // ctx.batch_size
        pipe = TakeFirst(pipe, n_batches - n_batches % ctx.world.world_size)
    pipe = pipe.sharding_filter()
    return pipe.load_images(transform=ctx.transform)


# A record in a worker's listing or shuffle buffer: a tuple of path, label, source and id.
_RECORD_BYTES = 400


def worker_memory(ctx: LoaderContext) -> int:
    """Every worker lists every file and fills its own shuffle buffer."""
    n = len(ctx.records)
    held = _RECORD_BYTES * (n + min(ctx.options.shuffle_buffer, n))
    return base.worker_memory(ctx, held=held)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    return data_loader(build_datapipe(ctx), ctx, shuffle=True, batched=True)
