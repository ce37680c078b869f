"""Pre-processed samples in fixed-layout arrays, read through memory maps: no pickle, no decode.

Each shard is one .npy file of uint8 images (n, 112, 112, 3): the article's decoded samples after
its one deterministic step, Resize(112, 112); labels and ids are in the shard's index (see
manifest.py), checked against its hash. Training gathers batches straight from the mapped file and
only crops and normalizes them. Fixed-size images mean sample k of a shard is at a known offset, so
nothing is loaded whole and nothing executes code: this is a format that is safe to share.
"""

from __future__ import annotations

import io
import os

import numpy as np
from torchvision.transforms import functional

from facebench.data.images import open_sample
from facebench.data.sources import Record
from facebench.data.transforms import RESIZE
from facebench.errors import ShardError

SUFFIX = ".npy"
SHAPE = (*RESIZE, 3)


def encode(samples: list[tuple[int, Record]]) -> bytes:
    """(sample id, record) pairs -> an .npy file of their 112x112 uint8 images."""
    images = np.empty((len(samples), *SHAPE), dtype=np.uint8)
    for row, (_, record) in enumerate(samples):
        image = functional.resize(open_sample(record.path, record.source), list(RESIZE))
        images[row] = np.asarray(image)
    buffer = io.BytesIO()
    np.save(buffer, images, allow_pickle=False)
    return buffer.getvalue()


def estimate_bytes(sizes: list[int], records: list[Record]) -> list[float]:
    """Each shard's bytes, for shards of these sample counts: exact (fixed-size records)."""
    return [128 + size * int(np.prod(SHAPE)) for size in sizes]


def data_offset(fd: int, path: str) -> int:
    """Where the images start in an open shard file, after checking its .npy header says
    (n, 112, 112, 3) uint8 in C order (pickled objects are refused)."""
    with os.fdopen(os.dup(fd), "rb") as file:
        file.seek(0)
        try:
            version = np.lib.format.read_magic(file)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(file)
        except ValueError as error:
            raise ShardError(
                f"{path}: not a raw shard ({error}); rebuild with prepare.py"
            ) from None
        if dtype != np.uint8 or tuple(shape[1:]) != SHAPE or fortran:
            raise ShardError(f"{path}: holds {dtype} {shape}, not images; rebuild")
        return file.tell()
