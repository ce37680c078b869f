"""torchdata.nodes, the maintained successor of DataPipes, over the original image files.

    SamplerWrapper(RandomSampler) -> Batcher(batch_size, drop_last)
      -> ParallelMapper(load a batch, n_workers, process or thread)
      -> PinMemory (CUDA) -> Prefetcher -> Loader

Batches of sample indices are formed first and each worker loads a whole batch, so one message
per batch crosses between processes, as with DataLoader workers; mapping single samples would send
one per image. Workers are processes by default (`loader.method=thread` for threads: PIL and
torchvision.io release the GIL while decoding). decoder=torchvision decodes with torchvision.io
into uint8 and normalizes whole batches; decoder=pil runs the seed's PIL transform per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.utils.data import RandomSampler
from torchdata.nodes import (
    Batcher,
    Loader,
    Mapper,
    ParallelMapper,
    PinMemory,
    Prefetcher,
    SamplerWrapper,
)

from facebench.config import LoaderConfig
from facebench.data.fast_decode import decode_resized
from facebench.data.images import open_sample
from facebench.data.sources import Record, celeba_records, digiface_records
from facebench.loaders.base import (
    Batch,
    LoaderContext,
    batch_rng,
    distributed_sampler,
    finish_on_device,
    uint8_batch,
    usable,
)


@dataclass
class Options(LoaderConfig):
    # process (default) or thread workers for ParallelMapper.
    method: str = "process"
    # torchvision: torchvision.io + batched tensor transforms; pil: the seed's PIL transform.
    decoder: str = "torchvision"


class ToRecords:
    """Sample indices -> (index, record) pairs, in the main process: workers then get only the
    records of their batch, not the whole list."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    def __call__(self, indices: list[int]) -> list[tuple[int, Record]]:
        return [(i, self.records[i]) for i in indices]


class LoadBatch:
    """(index, record) pairs -> (images, labels, ids); picklable for process workers."""

    def __init__(
        self, decoder: str, transform: Callable, crop: str, normalize: bool, epoch_seed: int
    ) -> None:
        self.epoch_seed = epoch_seed
        self.decoder = decoder
        self.transform = transform
        self.crop = crop
        self.normalize = normalize

    def __call__(self, batch: list[tuple[int, Record]]) -> tuple:
        chosen = [record for _, record in batch]
        labels = torch.tensor([r.label for r in chosen])
        ids = torch.tensor([i for i, _ in batch])
        if self.decoder == "pil":
            # RandomCrop draws from torch's global generator, which forked workers share.
            torch.manual_seed(int(batch_rng(self.epoch_seed, ids).integers(2**62)))
            images = [self.transform(open_sample(r.path, r.source)) for r in chosen]
            return torch.stack(images), labels, ids
        images = torch.stack([decode_resized(_read(r.path), r.source, r.path) for r in chosen])
        return uint8_batch(images, labels, ids, self.crop, self.normalize, self.epoch_seed)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def build(ctx: LoaderContext) -> Iterable[Batch]:
    options: Options = ctx.options
    # Listed inside the clock, as loader=dataset does: the same start-up work.
    records = usable(celeba_records(ctx.data_root, ctx.labels), ctx)
    records += usable(digiface_records(ctx.data_root, ctx.labels), ctx)
    on_gpu = ctx.device.type == "cuda"
    if ctx.world.distributed:
        sampler = distributed_sampler(range(len(records)), ctx)
    else:
        generator = torch.Generator().manual_seed(ctx.epoch_seed())
        sampler = RandomSampler(range(len(records)), generator=generator)
    node = SamplerWrapper(sampler)
    node = Batcher(node, batch_size=ctx.batch_size, drop_last=True)
    node = Mapper(node, map_fn=ToRecords(records))
    load = LoadBatch(
        options.decoder, ctx.transform, options.crop, not on_gpu, ctx.epoch_seed() + ctx.world.rank
    )
    if ctx.n_workers > 0:
        node = ParallelMapper(
            node, map_fn=load, num_workers=ctx.n_workers, method=options.method, in_order=True
        )
    else:
        node = Mapper(node, map_fn=load)
    if ctx.pin_memory:
        node = PinMemory(node)
    node = Prefetcher(node, prefetch_factor=ctx.options.prefetch_factor)
    loader = Loader(node)
    if on_gpu and options.decoder == "torchvision":
        return finish_on_device(loader, ctx.device)
    return loader
