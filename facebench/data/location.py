"""Where a run's data is, and how it is laid out, from its config: the folder it names, or the
synthetic stand-in, generated into the cache first if it is not there."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from facebench.data.sources import Layout
from facebench.data.synthetic import ensure_synthetic
from facebench.errors import DataError
from facebench.host.paths import cache_dir


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
