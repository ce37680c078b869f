"""WebDataset tar shards of the original encoded files: JPEG/PNG bytes, label, sample id.

Samples are grouped by key (the sample id, zero-padded): `<id>.jpg` for CelebA, `<id>.png` for
DigiFace1M or `<id>.img` for folder data, `<id>.cls` with the label, and `<id>.path` with the
source file (for error messages). Decoding (and CelebA's crop) happens at train time, in the
workers. Members carry fixed metadata so the same input always gives the same bytes.
"""

from __future__ import annotations

import io
import os
import tarfile

from facebench.data.folder import FOLDER
from facebench.data.sources import CELEBA, DIGIFACE, Record
from facebench.shards import room
from facebench.shards.formats import Settings, ShardFormat

# Each sample's image member, by source: the key says how to treat it (CelebA: its crop box).
IMAGE_KEYS = {CELEBA: "jpg", DIGIFACE: "png", FOLDER: "img"}
_BLOCK = tarfile.BLOCKSIZE


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    tar.addfile(info, io.BytesIO(data))


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """Each shard's bytes, for shards of these sample counts: the source files (from a sample
    of them) in 512-byte tar blocks, three members' headers, label and path, and the end mark."""
    per_sample = room.mean_file_bytes(records) + _BLOCK / 2 + 5 * _BLOCK
    return [size * per_sample + tarfile.RECORDSIZE for size in sizes]


def encode(samples: list[tuple[int, Record]], settings: Settings) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for sample_id, record in samples:
            key = f"{sample_id:09d}"
            extension = IMAGE_KEYS[record.source]
            with open(record.path, "rb") as file:
                _member(tar, f"{key}.{extension}", file.read())
            _member(tar, f"{key}.cls", str(record.label).encode())
            _member(tar, f"{key}.path", os.fsencode(record.path))  # any name the OS holds
    return buffer.getvalue()


# The original files: transform.resize does not change them.
FORMAT = ShardFormat(
    name="tar",
    suffix=".tar",
    resized=False,
    estimate_bytes=estimate_bytes,
    encode=encode,
    per_worker=True,
)
