"""What the loaders over columnar sets (Parquet, Lance) share: rows of encoded images -> a Batch,
each row's id and label checked against the run's own listing; and the epoch plan's order as
row numbers of a set that stores its samples in another (shuffled) order.

A row holds facebench's columns (shards/parquet_format.COLUMNS): id, label, source, path and the
image's encoded bytes. Its bytes are decoded by the loader's decoder (loader.decoder), timed as
the decode stage, as every loader that decodes does (loaders/decoding.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Sampler

from facebench.errors import ShardError
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shared import Batch


@dataclass(frozen=True)
class Rows:
    """Some rows of a columnar set, column by column, and where each came from (for errors)."""

    ids: Sequence[int]
    labels: Sequence[int]
    sources: Sequence[str]
    paths: Sequence[bytes]  # the source files' names, as the OS holds them
    images: Sequence[bytes]
    where: Sequence[str]  # each row's place: "row 17 of shard-00003.parquet", say


class DecodeRows:
    """Rows -> one Batch: ids and labels checked against the listing (a damaged or stale set
    stops the run rather than mislabel a sample), each image decoded and transformed, then
    collated. Picklable, for worker processes."""

    def __init__(self, stage: DecodeStage, labels: np.ndarray, folder: str, rebuild: str) -> None:
        self.stage = stage
        self.labels = labels
        self.folder = folder
        self.rebuild = rebuild

    def __call__(self, rows: Rows) -> Batch:
        ids = torch.as_tensor(np.asarray(rows.ids, dtype=np.int64))
        labels = torch.as_tensor(np.asarray(rows.labels, dtype=np.int64))
        known = (ids >= 0) & (ids < len(self.labels))
        if not bool(known.all()) or not np.array_equal(self.labels[ids.numpy()], labels.numpy()):
            bad = next(
                i
                for i in range(len(ids))
                if not known[i] or self.labels[int(ids[i])] != int(labels[i])
            )
            raise ShardError(
                f"{self.folder}: {rows.where[bad]} (sample id {int(ids[bad])}, label "
                f"{int(labels[bad])}) is not a sample of the data as listed now; the set is "
                f"damaged or stale. Rebuild: {self.rebuild}"
            )
        samples = [
            self.stage.sample(image, source, f"{os.fsdecode(path)} ({where} of {self.folder})")
            for image, source, path, where in zip(
                rows.images, rows.sources, rows.paths, rows.where, strict=True
            )
        ]
        return self.stage.batch(samples, labels, ids)


def row_numbers(ids: np.ndarray, n_samples: int, where: str) -> np.ndarray:
    """{sample id: its row} for a set whose rows hold these ids in this order; refused where
    the set does not hold every sample exactly once."""
    rows = np.full(n_samples, -1, dtype=np.int64)
    inside = (ids >= 0) & (ids < n_samples)
    rows[ids[inside]] = np.nonzero(inside)[0]
    if len(ids) != n_samples or not inside.all() or (rows < 0).any():
        raise ShardError(
            f"{where}: holds {len(ids):,} rows for {n_samples:,} samples, not each sample once; "
            "it is not the set of this data. Rebuild it with prepare.py"
        )
    return rows


class RowSampler(Sampler[int]):
    """The epoch plan's order (this rank's share), as rows of a set that stores samples in
    another order: what a map-style DataLoader's `shuffle=True` draws, the same on every rank."""

    def __init__(self, plan: EpochPlan, rows: np.ndarray) -> None:
        self.rows = rows[plan.positions()].tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows)
