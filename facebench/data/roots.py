"""Where a run's data and shards are, from its config."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from facebench.data.synthetic import ensure_synthetic
from facebench.errors import DataError
from facebench.paths import cache_dir


def data_root(data: DictConfig, n_procs: int = 0) -> Path:
    """The folder holding CelebA/ and DigiFace1M/; the synthetic one is generated if needed."""
    if data.name == "synthetic":
        return ensure_synthetic(cache_dir(data.cache_dir), data.n_images, data.seed, n_procs)
    root = Path(data.root).expanduser().resolve()
    if not root.is_dir():
        raise DataError(
            f"data.root={data.root}: no such folder. Point it at the folder that holds "
            "CelebA/ and DigiFace1M/"
        )
    return root


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
