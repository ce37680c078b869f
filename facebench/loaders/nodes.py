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

import numpy as np
import torch
from torch.utils.data import DistributedSampler, RandomSampler
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
from facebench.data.batch_transforms import crop_batch, crop_offsets, normalize_batch
from facebench.data.fast_decode import decode_resized
from facebench.data.images import open_sample
from facebench.data.sources import Record, celeba_records, digiface_records
from facebench.errors import ConfigError
from facebench.loaders.base import Batch, LoaderContext, finish_on_device, usable

METHODS = ("process", "thread")
DECODERS = ("torchvision", "pil")


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

    def __init__(self, decoder: str, transform: Callable, crop: str, normalize: bool) -> None:
        self.decoder = decoder
        self.transform = transform
        self.crop = crop
        self.normalize = normalize

    def __call__(self, batch: list[tuple[int, Record]]) -> tuple:
        chosen = [record for _, record in batch]
        labels = torch.tensor([r.label for r in chosen])
        ids = torch.tensor([i for i, _ in batch])
        if self.decoder == "pil":
            images = [self.transform(open_sample(r.path, r.source)) for r in chosen]
            return torch.stack(images), labels, ids
        images = torch.stack([decode_resized(_read(r.path), r.source, r.path) for r in chosen])
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))
        offsets = torch.from_numpy(crop_offsets(len(chosen), self.crop, rng))
        if self.normalize:
            return normalize_batch(crop_batch(images, offsets)), labels, ids
        return images, labels, ids, offsets


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def before_epoch(ctx: LoaderContext) -> dict[str, float]:
    options: Options = ctx.options
    if options.method not in METHODS:
        raise ConfigError(f"loader.method={options.method}: use one of {', '.join(METHODS)}")
    if options.decoder not in DECODERS:
        raise ConfigError(f"loader.decoder={options.decoder}: use one of {', '.join(DECODERS)}")
    return {}


def build(ctx: LoaderContext) -> Iterable[Batch]:
    options: Options = ctx.options
    # Listed inside the clock, as loader=dataset does: the same start-up work.
    records = usable(celeba_records(ctx.data_root, ctx.labels), ctx)
    records += usable(digiface_records(ctx.data_root, ctx.labels), ctx)
    on_gpu = ctx.device.type == "cuda"
    if ctx.world.distributed:
        sampler = DistributedSampler(
            range(len(records)),
            num_replicas=ctx.world.world_size,
            rank=ctx.world.rank,
            shuffle=True,
            seed=ctx.seed,
            drop_last=True,
        )
        sampler.set_epoch(ctx.epoch)
    else:
        generator = torch.Generator().manual_seed(ctx.epoch_seed())
        sampler = RandomSampler(range(len(records)), generator=generator)
    node = SamplerWrapper(sampler)
    node = Batcher(node, batch_size=ctx.batch_size, drop_last=True)
    node = Mapper(node, map_fn=ToRecords(records))
    load = LoadBatch(options.decoder, ctx.transform, options.crop, normalize=not on_gpu)
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
