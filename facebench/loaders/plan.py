"""One epoch's traversal, shared by every loader (ffcv's TraversalOrder is the model).

Each epoch draws one seed from the run's seed and the epoch number, the same on every rank and
every worker. From it:

- the order: one permutation of all samples (loaders that shuffle by index: dataset, nodes,
  raw, dali); loaders whose order comes from their own pipeline (shard order and shuffle
  buffers: datapipe, pickle, webdataset, litdata) seed that pipeline with the same seed;
- the rank split: the permutation cut into batches, batch b dealt to rank b % world_size, so
  every rank gets the same number of whole batches and each sample at most once;
- crop offsets: drawn per batch from the seed and the batch's sample ids, so they are the same
  whichever worker, thread or rank draws them, and differ between batches and epochs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from facebench.data.batch_transforms import crop_offsets
from facebench.data.transforms import ARTICLE, Geometry
from facebench.host.distributed import World


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's shuffles: the same on every rank and worker."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def batch_rng(seed: int, ids: torch.Tensor) -> np.random.Generator:
    """Randomness for one batch, from the epoch's seed and the batch's first sample: the same
    whichever worker, thread or rank draws it, and different for every batch and epoch (forked
    worker processes that were never reseeded would otherwise all draw the same)."""
    return np.random.default_rng([seed, int(ids[0]) if len(ids) else 0, len(ids)])


@dataclass(frozen=True)
class EpochPlan:
    seed: int  # this epoch's
    n_samples: int
    batch_size: int
    world: World = World()
    crop: str = "random"
    geometry: Geometry = ARTICLE

    def order(self) -> np.ndarray:
        """Every sample's position, in this epoch's order."""
        return np.random.default_rng(self.seed).permutation(self.n_samples)

    @property
    def n_batches(self) -> int:
        """Whole batches each rank gets: the same number for every rank."""
        return self.n_samples // self.batch_size // self.world.world_size

    def batches(self) -> Iterator[np.ndarray]:
        """This rank's batches, as sample positions: batch b of the order goes to rank
        b % world_size."""
        order = self.order()
        size, ranks = self.batch_size, self.world.world_size
        for mine in range(self.n_batches):
            index = mine * ranks + self.world.rank
            yield order[index * size : (index + 1) * size]

    def positions(self) -> np.ndarray:
        """This rank's samples, batch after batch (what a sampler hands a DataLoader)."""
        batches = list(self.batches())
        return np.concatenate(batches) if batches else np.array([], dtype=np.int64)

    def offsets(self, ids: torch.Tensor) -> torch.Tensor:
        """(n, 2) crop offsets for the batch of these sample ids."""
        rng = batch_rng(self.seed, ids)
        return torch.from_numpy(crop_offsets(len(ids), self.crop, rng, self.geometry))
