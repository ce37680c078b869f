"""Which samples go to which shard: one shuffle of all samples, cut into shard_size; and the
disk the set will take."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facebench.data.records import Record
from facebench.shards import room
from facebench.shards.formats import ShardFormat

SHARD_PREFIX = "shard-"
# When shards must be cut smaller than shard_size so that every worker reads one, they are cut
# for at least this many workers (as far as the data has batches for them): the worker counts
# one machine's sweep tries (the article's 5 and 10, up to 16) then share one set, where a set
# cut for exactly 5 workers would be rebuilt for 10.
SERVED_READERS = 16


@dataclass(frozen=True)
class Cut:
    names: list[str]  # each shard's file name
    chunks: list[np.ndarray]  # each shard's samples, as positions in the records

    def order(self) -> np.ndarray:
        """Every sample, in the shuffled order the shards hold them."""
        return np.concatenate(self.chunks) if self.chunks else np.array([], dtype=np.int64)

    def needed_bytes(
        self, folder: Path, shard_format: ShardFormat, records: list[Record], resize: int
    ) -> int:
        """What the set takes on disk, indexes and the build's records included."""
        sizes = [len(chunk) for chunk in self.chunks]
        shard_bytes = shard_format.estimate_bytes(sizes, records, resize)
        return room.set_bytes(shard_bytes, len(records), room.block_size(folder))


def shard_size_for(
    n_samples: int, shard_size: int, readers: int, built: int | None = None, batch_size: int = 1
) -> int:
    """The shard size to build with: shard_size, unless that gives fewer shards than `readers`
    (every rank's workers, each reading whole shards of its own and batching them itself); then
    `built` (the size of the set already in the folder) if it gives each a shard in whole
    batches, else the
    largest whole number of batches per shard that gives a shard to each of SERVED_READERS
    workers, or to as many as there are batches (so that no worker drops a part-batch it could
    have filled).

    Cutting for SERVED_READERS and reusing a smaller built size mean that a sweep over worker
    counts builds its shards once. The caller checks first that there are at least as many
    batches as readers (workers_without_a_batch)."""

    def enough(size: int) -> bool:
        return -(-n_samples // size) >= readers

    if readers <= 1 or enough(shard_size):
        return shard_size
    if built is not None and built <= shard_size and enough(built) and built % batch_size == 0:
        return built
    served = max(readers, min(SERVED_READERS, n_samples // batch_size))
    share = n_samples // served
    return max(1, share // batch_size * batch_size if share >= batch_size else share)


def workers_without_a_batch(n_samples: int, batch_size: int, readers: int) -> int:
    """How many of `readers` workers, each batching only what it reads, cannot fill one batch
    however the samples are cut into shards."""
    return max(0, readers - n_samples // max(1, batch_size))


def cut(n_samples: int, seed: int, shard_size: int, shard_format: ShardFormat) -> Cut:
    order = np.random.default_rng(seed).permutation(n_samples)
    chunks = [order[start : start + shard_size] for start in range(0, n_samples, shard_size)]
    names = [f"{SHARD_PREFIX}{index:05d}{shard_format.suffix}" for index in range(len(chunks))]
    return Cut(names, chunks)
