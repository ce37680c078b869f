"""Disk room for a shard set: estimated before writing, and explained when the disk fills.

Each format estimates the bytes its shards take (exactly for raw, from a sample of the source
images for pickle and tar); every file is rounded up to the filesystem's block size, and the
shards' indexes and the build's own records are counted too. A set that clearly cannot fit is
refused before anything is written or deleted.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from facebench.data.images import CELEBA_BOX, within_limit
from facebench.data.sources import CELEBA, Record
from facebench.errors import ShardError
from facebench.host.paths import nearest_existing

log = logging.getLogger(__name__)

_SAMPLE = 256  # source images whose size is read to estimate the rest
_FILES_PER_SHARD = 3  # the shard, its index, the build's record of it
_INDEX_BYTES_PER_SAMPLE = 16
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _sampled_mean(records: list[Record], measure: Callable[[Record], int]) -> float:
    if not records:
        return 0.0
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(records), min(_SAMPLE, len(records)), replace=False)
    return float(np.mean([measure(records[int(i)]) for i in chosen]))


def _decoded_bytes(record: Record) -> int:
    """RGB bytes of the image as the shards store it decoded (CelebA cropped to its box)."""
    if record.source == CELEBA:
        left, top, right, bottom = CELEBA_BOX
        return (right - left) * (bottom - top) * 3
    try:
        with Image.open(record.path) as image:  # reads the header only
            width, height = image.size
    except (OSError, ValueError, SyntaxError):
        return 0  # unreadable here: left out or reported elsewhere
    # An image over data.max_pixels is refused when it is reached: it takes no room.
    return width * height * 3 if within_limit(width, height) else 0


def _file_bytes(record: Record) -> int:
    try:
        return os.stat(record.path).st_size
    except OSError:
        return 0


def mean_decoded_bytes(records: list[Record]) -> float:
    return _sampled_mean(records, _decoded_bytes)


def mean_file_bytes(records: list[Record]) -> float:
    return _sampled_mean(records, _file_bytes)


def block_size(folder: Path) -> int:
    """The block size of the filesystem the set goes to (its folder may not be made yet)."""
    return os.statvfs(nearest_existing(folder)).f_frsize or 4096


def set_bytes(shard_bytes: list[float], n_samples: int, block: int) -> int:
    """What a set of shards of these sizes takes on disk, with indexes and records."""
    rounded = sum(block * -(-int(size) // block) for size in shard_bytes)
    index = n_samples * _INDEX_BYTES_PER_SAMPLE
    return rounded + index + len(shard_bytes) * (_FILES_PER_SHARD - 1) * block


def free_bytes(folder: Path) -> int:
    """The room left where the set goes (its folder may not be made yet)."""
    return shutil.disk_usage(nearest_existing(folder)).free


def bytes_in(folder: Path, prefix: str) -> int:
    """Bytes of the files in folder whose names start with prefix (an earlier set's shards)."""
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith(prefix))


def gb(n: float) -> str:
    """Bytes for people: 4.5 MB, 37.2 GB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def check_room(folder: Path, needed: int, reusable: int) -> None:
    """Refuse a set that cannot fit: it needs `needed` bytes, of which `reusable` are already
    taken by shards it replaces or reuses."""
    free = free_bytes(folder)
    short = needed - reusable - free
    if short > 0:
        raise ShardError(
            f"{folder}: not enough disk space for the shards: the set needs about {gb(needed)} "
            f"and {gb(free + reusable)} are free there. Free {gb(short)} or more, or set "
            "shards_dir=/a/disk/with/room"
        )
    log.info("%s: the set needs about %s; %s free", folder, gb(needed), gb(free))


def disk_full(folder: Path, needed: int, finished: int, total: int) -> ShardError:
    return ShardError(
        f"{folder}: the disk is full (no space left on device) after {finished} of {total} "
        f"shards; the set needs about {gb(needed)} and {gb(free_bytes(folder))} are free there "
        "now. Free space or set shards_dir=/a/disk/with/room, then run again: finished shards "
        "are kept and reused"
    )
