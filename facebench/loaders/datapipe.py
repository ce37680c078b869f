"""The seed's second pipeline, with the DataPipes built into torch (torchdata 0.10+ has none).

    IterableWrapper(CelebA records)
      .concat(FileLister(DigiFace1M, "*.png", recursive).map(to record))
      .shuffle(buffer_size)          # the seed's 100,000
      .sharding_filter()
      .load_image(transform)

Kept as the seed built it, costs included: every worker lists every file and fills its own
shuffle buffer of `shuffle_buffer` records before yielding anything (time to first batch, and a
buffer's worth of memory per worker), and only then drops the records that belong to the other
workers. The DataLoader gives every worker the same shuffle seed, which is what lets
sharding_filter split one order among them without gaps or repeats.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data.datapipes.datapipe import IterDataPipe
from torch.utils.data.datapipes.iter import FileLister, IterableWrapper

from facebench.config import LoaderConfig
from facebench.data.images import open_sample
from facebench.data.sources import DIGIFACE, celeba_records, digiface_record
from facebench.loaders.base import Batch, LoaderContext, data_loader


@dataclass
class Options(LoaderConfig):
    # Records held by each worker's Shuffler; the seed's 100,000.
    shuffle_buffer: int = 100_000


@torch.utils.data.functional_datapipe("load_image")
class ImageLoader(IterDataPipe):
    """Decode each (path, label, source) record and apply the shared transform."""

    def __init__(self, source_datapipe: IterDataPipe, transform: Callable) -> None:
        self.source_datapipe = source_datapipe
        self.transform = transform

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        for path, label, source in self.source_datapipe:
            yield self.transform(open_sample(path, source)), label


def build_datapipe(ctx: LoaderContext) -> IterDataPipe:
    options: Options = ctx.options
    celeba = IterableWrapper(celeba_records(ctx.data_root, ctx.labels), deepcopy=False)
    digiface = FileLister(str(Path(ctx.data_root) / DIGIFACE), masks="*.png", recursive=True)
    digiface = digiface.map(functools.partial(digiface_record, labels=ctx.labels))
    pipe = celeba.concat(digiface)
    pipe = pipe.shuffle(buffer_size=options.shuffle_buffer)
    pipe = pipe.sharding_filter()
    return pipe.load_image(transform=ctx.transform)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    return data_loader(build_datapipe(ctx), ctx, shuffle=True)
