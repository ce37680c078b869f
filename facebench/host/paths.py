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


def check_writable(path: Path) -> None:
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise DataError(
            f"{path}: cannot write shards here ({probe} is not writable); "
            "set shards_dir=/a/writable/folder"
        )
