"""What every loader receives and yields, and the DataLoader settings they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Sampler,
    default_collate,
)

from facebench.config import LoaderConfig
from facebench.data.batch_transforms import crop_offsets
from facebench.data.check import Listing
from facebench.data.sources import FACES, LabelSpace, Layout, Record
from facebench.data.transforms import ARTICLE, Geometry
from facebench.distributed import World
from facebench.resources import WORKER_OWN_BYTES, batch_bytes


class Batch(NamedTuple):
    """A batch as a loader hands it over: exactly what a GPU run copies to the device.

    images: finished (n, 3, 100, 100) float32, or, when `offsets` is given, (n, 112, 112, 3)
    uint8 that the device still crops (at `offsets`) and normalizes (facebench.finish): a quarter
    of the bytes cross between processes and over the bus, and the arithmetic runs where it is
    cheapest. ids: each sample's canonical position (data.sample_index), None where there are
    no real samples. jpegs: CelebA JPEGs left encoded for the GPU to decode, as (concatenated
    bytes, (2, k) lengths and slots in the batch).
    """

    images: torch.Tensor
    labels: torch.Tensor
    ids: torch.Tensor | None
    offsets: torch.Tensor | None = None
    jpegs: tuple[torch.Tensor, torch.Tensor] | None = None


def collate_samples(samples: list[tuple]) -> Batch:
    """(image, label, id) samples -> one finished Batch (the DataLoader's collate_fn)."""
    return Batch(*default_collate(samples))


@dataclass
class LoaderContext:
    """Everything a loader may use; built once per run, before the epoch clock starts."""

    options: LoaderConfig  # cfg.loader, typed as the loader's own schema
    data_root: Path
    labels: LabelSpace
    # Every sample in canonical order, listed before the clock starts. Loaders that time their own
    # listing (as the article's did) list again inside the clock; this one is for checks and ids.
    records: list[Record]
    batch_size: int
    n_workers: int
    seed: int
    device: torch.device
    transform: Callable[[Any], torch.Tensor]
    shards_dir: Path | None  # None for loaders that read no shards
    shard_size: int
    # Paths left out with on_bad_sample=skip; loaders that list files themselves drop these too.
    excluded: frozenset[str] = frozenset()
    # This process's place in a torchrun job; loaders split each epoch across ranks, then workers.
    world: World = field(default_factory=World)
    # Which measured epoch is being built: reshuffles, identically on every rank.
    epoch: int = 0
    on_bad_sample: str = "raise"
    verify_shards: bool = False
    # Where facebench keeps its own files (checks, generated data).
    cache: Path = Path(".cache")
    # The data as the run listed and checked it before the clock; shard builds reuse it.
    listing: Listing | None = None
    # How data_root is laid out, for loaders that list it themselves inside the clock.
    layout: Layout = FACES
    # Resize, crop and normalization sizes (transform.*): what `transform` applies per sample,
    # and what uint8 batches hold and the device finishes.
    geometry: Geometry = ARTICLE

    def epoch_seed(self) -> int:
        """A seed for this epoch's shuffle, the same on every rank and worker."""
        return int(np.random.SeedSequence([self.seed, self.epoch]).generate_state(1)[0])

    @property
    def pin_memory(self) -> bool:
        # Pinned host memory only helps copies to a CUDA device; elsewhere it costs RAM.
        return self.device.type == "cuda"


def data_loader(
    dataset: Dataset | IterableDataset,
    ctx: LoaderContext,
    shuffle: bool,
    batched: bool = False,
    sampler: Sampler | None = None,
) -> Iterable[Batch]:
    """A torch DataLoader with the settings every loader shares (drop_last, as the article).

    batched=True: the dataset yields whole batches itself, and the DataLoader only moves them.
    """
    generator = torch.Generator()
    # Shuffles agree across ranks through their samplers (or, for DataPipes, a seed the
    # DataLoader shares); the workers' own random crops must differ between ranks.
    generator.manual_seed(ctx.epoch_seed() + ctx.world.rank)
    extra: dict[str, Any] = {}
    if ctx.n_workers > 0:
        extra["prefetch_factor"] = ctx.options.prefetch_factor
    if not batched:
        extra["collate_fn"] = collate_samples
    return DataLoader(
        dataset,
        batch_size=None if batched else ctx.batch_size,
        shuffle=shuffle if sampler is None else False,
        sampler=sampler,
        drop_last=not batched,
        num_workers=ctx.n_workers,
        pin_memory=ctx.pin_memory,
        generator=generator,
        **extra,
    )


def worker_memory(ctx: LoaderContext, finished: bool = True, held: int = 0) -> int:
    """One worker's memory: its own pages, the batches it keeps ready (float32 crops, or uint8
    images when the device finishes them), and `held`, what the loader itself keeps."""
    shape = (3, *ctx.geometry.cropped) if finished else (*ctx.geometry.resized, 3)
    ready = ctx.options.prefetch_factor * batch_bytes(ctx.batch_size, shape, finished)
    return WORKER_OWN_BYTES + ready + held


def usable(records: list[Record], ctx: LoaderContext) -> list[Record]:
    """Records a loader listed itself, less those on_bad_sample=skip left out."""
    if not ctx.excluded:
        return records
    return [record for record in records if record.path not in ctx.excluded]


def distributed_sampler(dataset_or_range, ctx: LoaderContext) -> DistributedSampler:
    """Each rank its own equal share (drop_last), reshuffled each epoch alike on every rank."""
    sampler = DistributedSampler(
        dataset_or_range,
        num_replicas=ctx.world.world_size,
        rank=ctx.world.rank,
        shuffle=True,
        seed=ctx.seed,
        drop_last=True,
    )
    sampler.set_epoch(ctx.epoch)
    return sampler


def batch_rng(epoch_seed: int, ids: torch.Tensor) -> np.random.Generator:
    """Crop randomness for one batch, from the epoch's seed and the batch's first sample: the same
    whichever worker, thread or rank draws it, and different for every batch and epoch (forked
    worker processes that were never reseeded would otherwise all draw the same offsets)."""
    return np.random.default_rng([epoch_seed, int(ids[0]) if len(ids) else 0, len(ids)])


def batch_offsets(
    crop: str, epoch_seed: int, ids: torch.Tensor, geometry: Geometry = ARTICLE
) -> torch.Tensor:
    """(n, 2) crop offsets for the batch of these sample ids (see batch_rng)."""
    rng = batch_rng(epoch_seed, ids)
    return torch.from_numpy(crop_offsets(len(ids), crop, rng, geometry))


def uint8_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    ids: torch.Tensor,
    crop: str,
    epoch_seed: int,
    geometry: Geometry = ARTICLE,
) -> Batch:
    """A (n, 112, 112, 3) uint8 batch with its crop offsets, drawn now, for the device to finish."""
    return Batch(images, labels, ids, batch_offsets(crop, epoch_seed, ids, geometry))
