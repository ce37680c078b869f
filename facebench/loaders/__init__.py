"""The loaders, one module each, found by name.

A loader module defines `Options` (a `LoaderConfig` subclass, or `LoaderConfig` itself) and
`build(ctx: LoaderContext) -> Iterable[Batch]`, called inside the epoch clock. It may define
`SHARD_FORMAT` (the prepare.py format it reads: its shards are then built before the clock
when missing, and are the files whose page cache `cache=` controls), `before_epoch(ctx) ->
dict[str, float]` to replace that preparation (what it returns is logged as metrics), and
`data_files(ctx)` (the files an epoch reads; by default its shards, or every image).
Adding a loader is one module here and one YAML file in conf/loader/ whose defaults list names
`<module>_schema`.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from hydra.core.config_store import ConfigStore

from facebench.errors import ConfigError

_NOT_LOADERS = {"base", "shardsets"}


def names() -> list[str]:
    return sorted(
        info.name for info in pkgutil.iter_modules(__path__) if info.name not in _NOT_LOADERS
    )


def get(name: str) -> ModuleType:
    if name not in names():
        raise ConfigError(f"loader={name}: no such loader; choose one of {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}")


def register_schemas() -> None:
    """Store each loader's Options as `loader/<name>_schema` for its YAML file to name."""
    store = ConfigStore.instance()
    for name in names():
        store.store(group="loader", name=f"{name}_schema", node=get(name).Options)
