"""What a shard format is, and the formats there are: the one registry that prepare.py's
`format=`, each loader's LoaderSpec and the benchmarks read.

A format is written either shard by shard (`encode`: a list of samples -> one shard's bytes;
resumable, in worker processes) or whole, by its own library (`write_set`: every sample -> the
files of the set, in a folder of their own). Adding a format is one module that defines
`FORMAT = ShardFormat(...)`, listed in `_MODULES` below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from facebench.data.records import Record
from facebench.data.transforms import ARTICLE
from facebench.errors import ConfigError
from facebench.host.extras import Requirement
from facebench.shards.manifest import Manifest, ShardEntry

Samples = list[tuple[int, Record]]  # (sample id, record), in the order the set stores them
# Everything besides the source files that decides what a set holds (shards/freshness.py).
Settings = Mapping[str, Any]


@dataclass(frozen=True)
class ShardFormat:
    name: str  # prepare.py format=<name>
    suffix: str  # of each shard's file
    # Whether its shards hold samples resized to transform.resize (so that a change of the resize
    # rebuilds the set) rather than the original or decoded images.
    resized: bool
    # Each shard's bytes on disk, for shards of these sample counts: (sizes, records, resize).
    estimate_bytes: Callable[[list[int], list[Record], int], list[float]]
    # Shard by shard: (samples, the set's settings) -> the shard's bytes.
    encode: Callable[[Samples, Settings], bytes] | None = None
    # Whole set: (samples, folder, n_procs, cache, the set's settings) -> the entries of the
    # files it wrote.
    write_set: Callable[[Samples, Path, int, Path, Settings], list[ShardEntry]] | None = None
    # Whole set: whether a file of this name may be one of the library's own.
    writes: Callable[[str], bool] | None = None
    requires: Requirement | None = None
    # Whether a loader's workers each read whole shards of their own (so that each needs one):
    # shard_size is then cut down to give every worker a shard (shards/plan.py).
    per_worker: bool = False
    # Whole set: (folder, manifest) -> raises ShardError where the set's own index asks its
    # library for anything facebench does not write (a serializer that unpickles, say), before
    # a loader hands the folder to that library.
    check_set: Callable[[Path, Manifest], None] | None = None
    # Whether its files are cut into row groups of `row_group_size` samples (Parquet's unit of
    # a read), so that the setting is one of the set's.
    row_groups: bool = False

    @property
    def whole_set(self) -> bool:
        return self.write_set is not None


_MODULES = (
    "pickle_format",
    "raw_format",
    "tar_format",
    "litdata_format",
    "parquet_format",
    "lance_format",
)


def _all() -> dict[str, ShardFormat]:
    found = [importlib.import_module(f"facebench.shards.{m}").FORMAT for m in _MODULES]
    return {shard_format.name: shard_format for shard_format in found}


def resize_of(settings: Settings) -> int:
    """The resize a set's samples have (the article's for formats that store no resized ones)."""
    return int(settings.get("resize", ARTICLE.resize))


def names() -> list[str]:
    return list(_all())


def get(name: str) -> ShardFormat:
    """The format `format=<name>` names; one line with the choices when there is none."""
    formats = _all()
    if name not in formats:
        raise ConfigError(f"format={name}: use one of {', '.join(formats)}")
    return formats[name]
