"""Pre-processed samples in fixed-layout arrays, read record by record with pread: no pickle,
no decode.

Each shard is one .npy file of uint8 images (n, 112, 112, 3), or (n, r, r, 3) with
transform.resize=r: the article's decoded samples after its one deterministic step, the resize.
Labels and ids are in the shard's index (see manifest.py), checked against its hash. Training
gathers each batch's records from the files with one pread each (`gather`) and only crops and
normalizes them. Fixed-size images mean sample k of a shard is at a known offset, so nothing is
loaded whole and nothing executes code: this is a format that is safe to share.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

import numpy as np
from torchvision.transforms import functional

from facebench.data.images import open_sample
from facebench.data.sources import Record
from facebench.errors import ShardError
from facebench.shards.formats import Settings, ShardFormat, resize_of


def shape(resize: int) -> tuple[int, int, int]:
    """One record's shape: (resize, resize, 3) uint8."""
    return (resize, resize, 3)


def gather(
    files: list[int],
    data_starts: list[int],
    starts: np.ndarray,
    positions: np.ndarray,
    out: np.ndarray,
) -> int | None:
    """Read the records at these (sorted) global positions into out (n, r, r, 3), one pread
    each: `files` the open shards, `data_starts` where each one's images begin, `starts` the
    global position of each shard's first record. The index of a shard that ended short, else
    None."""
    record = out[0].nbytes
    rows = out.reshape(len(positions), record)
    shard_of = np.searchsorted(starts, positions, side="right") - 1
    offsets = np.asarray(data_starts)[shard_of] + (positions - starts[shard_of]) * record
    for row, shard, offset in zip(rows, shard_of.tolist(), offsets.tolist(), strict=True):
        if os.preadv(files[shard], [row], offset) != record:
            return shard
    return None


def encode(samples: list[tuple[int, Record]], settings: Settings) -> bytes:
    """(sample id, record) pairs -> an .npy file of their resize x resize uint8 images."""
    resize = resize_of(settings)
    images = np.empty((len(samples), *shape(resize)), dtype=np.uint8)
    for row, (_, record) in enumerate(samples):
        image = functional.resize(open_sample(record.path, record.source), [resize, resize])
        images[row] = np.asarray(image)
    buffer = io.BytesIO()
    np.save(buffer, images, allow_pickle=False)
    return buffer.getvalue()


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """Each shard's bytes, for shards of these sample counts: exact (fixed-size records)."""
    return [128 + size * int(np.prod(shape(resize))) for size in sizes]


HEADER_BYTES = 4096  # enough for any header this format writes (numpy pads it to 64 bytes)


def data_offset(fd: int, path: str, resize: int) -> int:
    """Where the images start in an open shard file, after checking its .npy header says
    (n, resize, resize, 3) uint8 in C order (pickled objects are refused)."""
    with os.fdopen(os.dup(fd), "rb") as file:
        file.seek(0)
        return header_end(file, path, resize)


def header_end(file: BinaryIO, path: str, resize: int) -> int:
    """The same, from a shard's first bytes (a file at its start, or a range GET's bytes)."""
    try:
        version = np.lib.format.read_magic(file)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        found, fortran, dtype = read_header(file)
    except ValueError as error:
        raise ShardError(f"{path}: not a raw shard ({error}); rebuild with prepare.py") from None
    if dtype != np.uint8 or tuple(found[1:]) != shape(resize) or fortran:
        raise ShardError(
            f"{path}: holds {dtype} {found}, not {resize}x{resize} images; rebuild with "
            "prepare.py format=raw"
        )
    return file.tell()


FORMAT = ShardFormat(
    name="raw", suffix=".npy", resized=True, estimate_bytes=estimate_bytes, encode=encode
)
