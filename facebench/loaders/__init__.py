"""The loaders: one module each, named by its YAML file in conf/loader/.

A loader module defines `LOADER`, a `LoaderSpec` (facebench/loaders/spec.py): its options
schema, `build(ctx)` (one epoch's batches, called inside the clock), `worker_memory(ctx)`, and
what it needs before the clock (the shard format it reads, or its own preparation). Adding a
loader is one module here and one YAML file in conf/loader/ whose defaults list names
`<module>_schema`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from facebench.data.sources import LabelSpace, Record
from facebench.data.transforms import Geometry, article_transform
from facebench.distributed import World
from facebench.errors import ConfigError
from facebench.loaders.base import LoaderContext
from facebench.loaders.spec import LoaderSpec
from facebench.paths import PROJECT_ROOT, cache_dir, data_layout, shards_root

CONFIGS = PROJECT_ROOT / "conf" / "loader"


def names(real_only: bool = False) -> list[str]:
    """Every loader, as conf/loader/ names them; real_only: those that read real samples (not
    the compute ceiling)."""
    every = sorted(path.stem for path in CONFIGS.glob("*.yaml"))
    return [name for name in every if not (real_only and get(name).synthetic)]


def get(name: str) -> LoaderSpec:
    """The loader named `name` (loader=<name>)."""
    if name not in names():
        raise ConfigError(f"loader={name}: no such loader; choose one of {', '.join(names())}")
    spec = getattr(importlib.import_module(f"{__name__}.{name}"), "LOADER", None)
    if not isinstance(spec, LoaderSpec):
        raise ConfigError(
            f"facebench/loaders/{name}.py defines no LOADER = LoaderSpec(...); every loader "
            "named in conf/loader/ needs one (see facebench/loaders/spec.py)"
        )
    return spec


def register_schemas() -> None:
    """Store each loader's options schema as `loader/<name>_schema` for its YAML file to name."""
    store = ConfigStore.instance()
    for name in names():
        store.store(group="loader", name=f"{name}_schema", node=get(name).options)


def context(
    cfg: DictConfig,
    spec: LoaderSpec,
    root: Path,
    records: list[Record],
    labels: LabelSpace,
    device: torch.device,
    excluded: frozenset[str] = frozenset(),
    world: World | None = None,
) -> LoaderContext:
    """What the configured loader gets to build its pipeline from."""
    shards = shards_root(cfg.shards_dir, root, spec.shard_format) if spec.shard_format else None
    return LoaderContext(
        options=cfg.loader,
        data_root=root,
        labels=labels,
        records=records,
        batch_size=cfg.batch_size,
        n_workers=cfg.n_workers,
        seed=cfg.seed,
        device=device,
        transform=article_transform(cfg.loader.crop, Geometry.of(cfg.transform)),
        shards_dir=shards,
        shard_size=cfg.shard_size,
        excluded=excluded,
        world=world or World(),
        on_bad_sample=cfg.on_bad_sample,
        verify_shards=cfg.verify_shards,
        cache=cache_dir(cfg.data.cache_dir),
        layout=data_layout(cfg.data),
        geometry=Geometry.of(cfg.transform),
    )
