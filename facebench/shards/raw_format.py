"""Pre-processed samples in fixed-layout arrays, read through memory maps: no pickle, no decode.

Each shard is one .npy file of records (image uint8 112x112x3, label int64, id int64): the seed's
decoded samples after its one deterministic step, Resize(112, 112). Training gathers batches
straight from the mapped file and only crops and normalizes them. Fixed-size records mean
sample k of a shard is at a known offset, so nothing is loaded whole and nothing executes code:
this is a format that is safe to share.
"""

from __future__ import annotations

import io

import numpy as np
from torchvision.transforms import functional

from facebench.data.images import open_sample
from facebench.data.sources import Record
from facebench.data.transforms import RESIZE

SUFFIX = ".npy"
RECORD = np.dtype([("image", np.uint8, (*RESIZE, 3)), ("label", np.int64), ("id", np.int64)])


def encode(samples: list[tuple[int, Record]]) -> bytes:
    """(sample id, record) pairs -> an .npy file of records."""
    records = np.empty(len(samples), dtype=RECORD)
    for row, (sample_id, record) in enumerate(samples):
        image = functional.resize(open_sample(record.path, record.source), list(RESIZE))
        records[row] = (np.asarray(image), record.label, sample_id)
    buffer = io.BytesIO()
    np.save(buffer, records, allow_pickle=False)
    return buffer.getvalue()


def open_shard(path: str) -> np.ndarray:
    """The shard's records, memory-mapped read-only (pickled objects are refused)."""
    records = np.load(path, mmap_mode="r", allow_pickle=False)
    if records.dtype != RECORD:
        raise ValueError(f"{path}: records of {records.dtype}, expected {RECORD}")
    return records
