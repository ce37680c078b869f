"""What every loader receives, and the DataLoader settings they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from facebench.config import LoaderConfig
from facebench.data.sources import LabelSpace

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class LoaderContext:
    """Everything a loader may use; built once per run, before the epoch clock starts."""

    options: LoaderConfig  # cfg.loader, typed as the loader's own schema
    data_root: Path
    labels: LabelSpace
    batch_size: int
    n_workers: int
    seed: int
    device: torch.device
    transform: Callable[[Any], torch.Tensor]
    shards_dir: Path
    shard_size: int

    @property
    def pin_memory(self) -> bool:
        # Pinned host memory only helps copies to a CUDA device; elsewhere it costs RAM.
        return self.device.type == "cuda"


def data_loader(
    dataset: Dataset | IterableDataset, ctx: LoaderContext, shuffle: bool
) -> Iterable[Batch]:
    """A torch DataLoader with the settings every loader shares (drop_last, as the seed)."""
    generator = torch.Generator()
    generator.manual_seed(ctx.seed)
    extra: dict[str, Any] = {}
    if ctx.n_workers > 0:
        extra["prefetch_factor"] = ctx.options.prefetch_factor
    return DataLoader(
        dataset,
        batch_size=ctx.batch_size,
        shuffle=shuffle,
        drop_last=True,
        num_workers=ctx.n_workers,
        pin_memory=ctx.pin_memory,
        generator=generator,
        **extra,
    )
