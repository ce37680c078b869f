"""Where things are: the checkout, facebench's cache, a run's shards (data: data/location.py)."""

from __future__ import annotations

import os
from pathlib import Path

from facebench.errors import DataError

# The checkout that holds train.py; facebench is installed from it in editable mode.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def cache_dir(configured: str = "") -> Path:
    """Generated data and shards: outside git, reused across runs."""
    return Path(configured).expanduser().resolve() if configured else PROJECT_ROOT / ".cache"


def shards_root(shards_dir: str, root: Path, shard_format: str) -> Path:
    """Shards live next to the data they come from, unless shards_dir says otherwise."""
    base = Path(shards_dir).expanduser().resolve() if shards_dir else root / "facebench-shards"
    return base / shard_format


def nearest_existing(path: Path) -> Path:
    """The path, or its nearest ancestor that exists: where something not yet made will go,
    whose permissions, block size and free space are the ones it will meet."""
    while not path.exists():
        path = path.parent
    return path


def check_writable(path: Path) -> None:
    """Refuse a shards folder that cannot be written (nor, where it is not yet made, its
    nearest existing ancestor, where it would be made)."""
    probe = nearest_existing(path)
    if not os.access(probe, os.W_OK):
        raise DataError(
            f"{path}: cannot write shards here ({probe} is not writable); "
            "set shards_dir=/a/writable/folder"
        )
