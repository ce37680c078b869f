"""What every loader receives, and the DataLoader settings they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from facebench.config import LoaderConfig
from facebench.data.batch_transforms import crop_batch, normalize_batch
from facebench.data.sources import LabelSpace, Record
from facebench.distributed import World

# (images, labels, sample ids): ids are canonical positions (see data.sample_index), or None for
# loaders with no real samples.
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass
class LoaderContext:
    """Everything a loader may use; built once per run, before the epoch clock starts."""

    options: LoaderConfig  # cfg.loader, typed as the loader's own schema
    data_root: Path
    labels: LabelSpace
    # Every sample in canonical order, listed before the clock starts. Loaders that time their own
    # listing (as the seed's did) list again inside the clock; this one is for checks and ids.
    records: list[Record]
    batch_size: int
    n_workers: int
    seed: int
    device: torch.device
    transform: Callable[[Any], torch.Tensor]
    shards_dir: Path
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
    """A torch DataLoader with the settings every loader shares (drop_last, as the seed).

    batched=True: the dataset yields whole batches itself, and the DataLoader only moves them.
    """
    generator = torch.Generator()
    generator.manual_seed(ctx.epoch_seed())
    extra: dict[str, Any] = {}
    if ctx.n_workers > 0:
        extra["prefetch_factor"] = ctx.options.prefetch_factor
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


def finish_on_device(batches: Iterable, device: torch.device) -> Iterator[Batch]:
    """Move (uint8 images, labels, ids, crop offsets) batches to the device, then crop and
    normalize them there: a quarter of the bytes of float cross the bus, and the GPU does the
    arithmetic."""
    for images, labels, ids, offsets in batches:
        images = images.to(device, non_blocking=True)
        offsets = offsets.to(device, non_blocking=True)
        yield normalize_batch(crop_batch(images, offsets)), labels, ids


def usable(records: list[Record], ctx: LoaderContext) -> list[Record]:
    """Records a loader listed itself, less those on_bad_sample=skip left out."""
    if not ctx.excluded:
        return records
    return [record for record in records if record.path not in ctx.excluded]
