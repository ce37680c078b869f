"""Pre-decoded samples in memory-mapped arrays: gather a batch, crop and normalize it, done.

prepare.py (format=raw) stores each sample once, decoded and resized to 112x112 (the seed's only
deterministic step), in fixed-size records. Each epoch draws one permutation of all samples
(shared by the workers through its seed), cuts it into batches, and worker w gathers batches w,
w + n_workers, ...: a full shuffle, no decoding, no pickle, nothing loaded whole. A worker maps a
shard only while it gathers from it, so its memory stays at a few batches.

The random crop and normalization run on the whole batch: vectorized in the worker when the
device is the CPU; on a GPU the workers send uint8 (a quarter of the bytes of float) and the crop
and normalization run there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from facebench.config import LoaderConfig
from facebench.data.batch_transforms import crop_batch, crop_offsets, normalize_batch
from facebench.errors import ShardError
from facebench.loaders import base
from facebench.loaders.base import Batch, LoaderContext, data_loader, finish_on_device
from facebench.loaders.shardsets import ShardGuard, trusted_manifest
from facebench.shards import raw_format
from facebench.shards.manifest import read_index

log = logging.getLogger(__name__)

Options = LoaderConfig
SHARD_FORMAT = "raw"


class RawBatches(IterableDataset):
    """Batches gathered from memory-mapped shards in one shuffled order per epoch."""

    def __init__(
        self,
        paths: list[str],
        index: np.ndarray,
        sizes: list[int],
        batch_size: int,
        epoch_seed: int,
        crop: str,
        normalize: bool,
        guard: ShardGuard,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.paths = paths
        self.guard = guard
        # A shard rebuilt under the same name has the same size (and maybe a reused inode
        # number): its inode and time of writing together tell it apart.
        self.identities = [_identity(path) for path in paths]
        self.labels = np.ascontiguousarray(index["label"])  # verified against the manifest
        self.ids = np.ascontiguousarray(index["id"])
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.batch_size = batch_size
        self.epoch_seed = epoch_seed
        self.crop = crop
        self.normalize = normalize  # False: leave crop and normalize to the device
        self.rank = rank
        self.world_size = world_size

    def __len__(self) -> int:
        # Whole batches, and the same number for every rank.
        n_batches = int(self.starts[-1]) // self.batch_size
        return n_batches - n_batches % self.world_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        worker = get_worker_info()
        worker_id, n_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        order = np.random.default_rng(self.epoch_seed).permutation(int(self.starts[-1]))
        # Batch b goes to rank b % world_size, and within the rank round-robin to its workers.
        share = self.rank + self.world_size * worker_id
        for index in range(share, len(self), self.world_size * n_workers):
            chosen = order[index * self.batch_size : (index + 1) * self.batch_size]
            images = torch.from_numpy(self._gather(chosen))
            # Per-batch crop randomness, so results do not depend on the number of workers.
            rng = np.random.default_rng([self.epoch_seed, index])
            offsets = torch.from_numpy(crop_offsets(len(chosen), self.crop, rng))
            labels = torch.from_numpy(self.labels[chosen])
            ids = torch.from_numpy(self.ids[chosen])
            if self.normalize:
                yield normalize_batch(crop_batch(images, offsets)), labels, ids
            else:
                yield images, labels, ids, offsets

    def _gather(self, positions: np.ndarray) -> np.ndarray:
        """The images at these global positions, in this order."""
        out = np.empty((len(positions), *raw_format.SHAPE), dtype=np.uint8)
        shard_of = np.searchsorted(self.starts, positions, side="right") - 1
        for shard in np.unique(shard_of):
            mask = shard_of == shard
            local = positions[mask] - self.starts[shard]
            # Mapped only for this gather: the pages do not stay in the worker's memory.
            path = self.paths[shard]
            with self.guard.reading(path):
                images = raw_format.open_shard(path)
                if _identity(path) != self.identities[shard]:
                    raise ShardError(f"{path}: replaced during the run")
            order = np.argsort(local)  # ascending offsets read the file front to back
            out[np.flatnonzero(mask)[order]] = images[local[order]]
            del images
        return out


def worker_memory(ctx: LoaderContext) -> int:
    return base.worker_memory(ctx, finished=ctx.device.type != "cuda")


def _identity(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_ino, stat.st_mtime_ns


def build(ctx: LoaderContext) -> Iterable[Batch]:
    manifest = trusted_manifest(ctx)
    on_gpu = ctx.device.type == "cuda"
    dataset = RawBatches(
        paths=[str(ctx.shards_dir / shard.name) for shard in manifest.shards],
        index=np.concatenate([read_index(ctx.shards_dir, shard) for shard in manifest.shards]),
        sizes=[shard.samples for shard in manifest.shards],
        batch_size=ctx.batch_size,
        epoch_seed=ctx.epoch_seed(),  # the same on every rank and worker
        crop=ctx.options.crop,
        normalize=not on_gpu,
        guard=ShardGuard.of(ctx.shards_dir, manifest),
        rank=ctx.world.rank,
        world_size=ctx.world.world_size,
    )
    loader = data_loader(dataset, ctx, shuffle=False, batched=True)
    return finish_on_device(loader, ctx.device) if on_gpu else loader
