"""The loader contract: what each loader module tells the runner, in one typed object.

Each module in facebench/loaders/ named by a YAML file in conf/loader/ defines

    LOADER = LoaderSpec(options=..., build=..., worker_memory=..., ...)

and the runner asks it nothing else. Its whole behavior is read in that module.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from facebench.config import LoaderConfig
from facebench.errors import ConfigError
from facebench.loaders.base import Batch, LoaderContext
from facebench.loaders.shardsets import ensure_loader_shards, shard_files


@dataclass(frozen=True)
class LoaderSpec:
    """One loader: its options schema, how it builds an epoch, and what it needs first."""

    # The schema of cfg.loader (LoaderConfig or a subclass), checked when Hydra composes.
    options: type[LoaderConfig]
    # One epoch's batches; called inside the epoch clock, once per epoch.
    build: Callable[[LoaderContext], Iterable[Batch]]
    # Bytes one worker needs at most, for the check that n_workers fits this machine.
    worker_memory: Callable[[LoaderContext], int]
    # The prepare.py format it reads: built before the clock when missing, and the files whose
    # page cache `cache=` controls. None: it reads the image files.
    shard_format: str | None = None
    # Whether each worker batches its own shards (one partial batch per worker may be dropped)
    # rather than the epoch being batched in one place.
    batches_per_worker: bool = False
    # A compute ceiling: no real samples, nothing to count, nothing read.
    synthetic: bool = False
    # Work before the clock in place of building shard_format (its return is logged as metrics).
    prepare: Callable[[LoaderContext], dict[str, float]] | None = None
    # The Python package it needs and the extra that installs it: ("nvidia.dali", "dali").
    requires: tuple[str, str] | None = None

    def available(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires[0]) is not None

    def require(self, name: str) -> None:
        """Refuse, with the install command, when its package is missing."""
        if not self.available():
            package, extra = self.requires  # type: ignore[misc]
            raise ConfigError(
                f"loader={name} needs {package}, which is not installed: "
                f"pip install -e '.[{extra}]'"
            )

    def before_epoch(self, ctx: LoaderContext) -> dict[str, float]:
        """Its preparation, outside the clock: by default, build its shards if missing."""
        if self.prepare is not None:
            return self.prepare(ctx)
        if self.shard_format is not None:
            return ensure_loader_shards(ctx, self.shard_format)
        return {}

    def data_files(self, ctx: LoaderContext) -> list[str]:
        """The files an epoch reads: its shards, or every image, or nothing."""
        if self.synthetic:
            return []
        if self.shard_format is not None:
            return shard_files(ctx)
        return [record.path for record in ctx.records]
