"""Where things are: the checkout, facebench's cache, a run's data and its shards."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from facebench.data.sources import Layout
from facebench.data.synthetic import ensure_synthetic
from facebench.errors import DataError

# The checkout that holds train.py; facebench is installed from it in editable mode.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def cache_dir(configured: str = "") -> Path:
    """Generated data and shards: outside git, reused across runs."""
    return Path(configured).expanduser().resolve() if configured else PROJECT_ROOT / ".cache"


def data_root(data: DictConfig, n_procs: int = 0) -> Path:
    """The data's folder; the synthetic one is generated first if it is not in the cache."""
    if data.name == "synthetic":
        return ensure_synthetic(
            cache_dir(data.cache_dir), data.n_images, data.seed, n_procs, layout=data.layout
        )
    root = Path(data.root).expanduser().resolve()
    if not root.is_dir():
        holding = "one folder per class" if data.layout == "folder" else "CelebA/ and DigiFace1M/"
        raise DataError(
            f"data.root={data.root}: no such folder. Point it at the folder that holds {holding}"
        )
    return root


def data_layout(data: DictConfig) -> Layout:
    """How the configured data is laid out, as the listing code reads it."""
    return Layout(kind=str(data.layout), labels=data.labels)


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
