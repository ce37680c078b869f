"""The loaders: one module each, named by its YAML file in conf/loader/, and those registered.

A loader module defines `LOADER`, a `LoaderSpec` (facebench/loaders/spec.py): its options
schema, `build(ctx)` (one epoch's batches, called inside the clock), `worker_memory(ctx)`, its
traits, and what it needs before the clock (the shard format it reads, or its own preparation).
Adding a loader is one module here and one YAML file in conf/loader/ whose defaults list names
`<module>_schema`; a loader kept elsewhere (a plugin, a test's) is added with `register`.

May import: shards, data, storage, host, stages, results, config, errors.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import torch
from hydra.core.config_store import ConfigStore

from facebench.config import LoaderConfig, TrainConfig, Workers
from facebench.data import decoders
from facebench.data.listing import Listing
from facebench.data.location import data_layout
from facebench.data.transforms import Geometry, article_transform
from facebench.errors import ConfigError
from facebench.host import shared_memory
from facebench.host.distributed import World, barrier
from facebench.host.paths import PROJECT_ROOT, cache_dir, shards_root
from facebench.host.resources import check_workers
from facebench.host.shared_memory import InFlight
from facebench.loaders import searchpath
from facebench.loaders.failures import count_oom_kills_from_now
from facebench.loaders.shared import LoaderContext
from facebench.loaders.spec import Handover, LoaderSpec
from facebench.shards.in_bucket import bucket_folder
from facebench.storage.address import in_bucket

CONFIGS = PROJECT_ROOT / "conf" / "loader"
_registered: dict[str, LoaderSpec] = {}
_users: dict[str, Path] = {}  # loader files in the command's hydra.searchpath, by name


def add_search_path(args: list[str]) -> None:
    """Take the loaders in the loader/ folders of a command line's hydra.searchpath as choices
    of their own (`loader=shop` for myconf/loader/shop.yaml)."""
    _users.update(searchpath.user_loaders(searchpath.folders(args)))


def user_file(name: str) -> Path | None:
    """The YAML file of a loader from the command's hydra.searchpath; None for facebench's."""
    return _users.get(name) if name not in _builtin() else None


def _builtin() -> set[str]:
    return {path.stem for path in CONFIGS.glob("*.yaml")} | set(_registered)


def names(real_only: bool = False, storage: str = "local") -> list[str]:
    """Every loader (conf/loader/, registered ones, and those in the loader/ folders of the
    command's hydra.searchpath); real_only: facebench's that read real samples (not the compute
    ceiling, not a user's own pipeline) from `storage` (local: this machine's files; s3: a
    bucket)."""
    every = sorted(_builtin() | set(_users))
    if not real_only:
        return every
    return [
        name
        for name in every
        if not get(name).ceiling and get(name).own is None and get(name).reads(storage)
    ]


def get(name: str) -> LoaderSpec:
    """The loader named `name` (loader=<name>)."""
    if name in _registered:
        return _registered[name]
    if (path := user_file(name)) is not None:
        return get(searchpath.base_of(path, sorted(_builtin())))
    if not (CONFIGS / f"{name}.yaml").is_file():
        raise ConfigError(f"loader={name}: no such loader; choose one of {', '.join(names())}")
    spec = getattr(importlib.import_module(f"{__name__}.{name}"), "LOADER", None)
    if not isinstance(spec, LoaderSpec):
        raise ConfigError(
            f"facebench/loaders/{name}.py defines no LOADER = LoaderSpec(...); every loader "
            "named in conf/loader/ needs one (see facebench/loaders/spec.py)"
        )
    return spec


def refuse_unknown(requested: list[str], key: str) -> None:
    """Refuse, in one line naming `key` and the choices, any name in `requested` that is not a
    loader reading real samples (advise's `loaders` list, say)."""
    choices = names(real_only=True)
    unknown = [name for name in requested if name not in choices]
    if unknown:
        raise ConfigError(
            f"{key}: {', '.join(unknown)} is no loader; choose from {', '.join(choices)}"
        )


def set_up(
    cfg: TrainConfig,
    spec: LoaderSpec,
    ctx: LoaderContext,
    world: World,
    loop_holds: int | None = None,
) -> dict[str, float]:
    """The loader's setup, once per job, outside the clock: its library checked first, its
    shards built if missing; then the checks that its workers fit this machine: memory, a
    temporary folder short enough for their sockets, and, given what the epoch loop holds
    (`loop_holds` batches), the shared memory their batches cross (advise checks each worker
    count itself). Rank 0 first: it builds what the others then reuse. Its metrics (the
    shards' build time, say)."""
    spec.require(cfg.loader.name)
    decoders.require(str(getattr(cfg.loader, "decoder", "")))
    metrics = spec.set_up_job(ctx)
    if world.is_main:
        barrier(world)
    check_workers(
        cfg.loader.name,
        cfg.n_workers,
        spec.worker_memory(ctx),
        processes_per_machine=world.local_world_size,
        enabled=cfg.resource_check,
        # Ranks this job started for its emulated accelerators: fewer of them is the fix.
        ranks_setting="accelerators_per_host" if cfg.accelerators_per_host > 1 else "",
    )
    traits = spec.traits_for(ctx.options)
    if traits.workers == Workers.process and cfg.n_workers and spec.through_shared_memory:
        shared_memory.check_socket_folder(cfg.loader.name)
    if loop_holds is not None:  # after the memory's check: more workers than memory come first
        batches = in_flight(cfg.loader.name, spec, ctx, loop_holds)
        shared_memory.check(batches, threaded, enabled=cfg.resource_check)
    count_oom_kills_from_now()
    return metrics


def in_flight(name: str, spec: LoaderSpec, ctx: LoaderContext, loop_holds: int) -> InFlight | None:
    """What the loader's worker processes have in shared memory at once, from its traits
    (what it hands over, whether its workers are processes), the run's settings and the batches
    the epoch loop holds; None for a loader whose workers are threads, or with no workers, or
    that hands nothing over through /dev/shm (Ray's object store)."""
    traits = spec.traits_for(ctx.options)
    if traits.workers != Workers.process or ctx.n_workers == 0 or not spec.through_shared_memory:
        return None
    if traits.handover == Handover.own:
        return None  # a user's batches: their size is known once they are made
    if traits.handover == Handover.normalized:
        crop = ctx.geometry.cropped
        image_bytes, kind = 4 * 3 * crop[0] * crop[1], f"float32 3x{crop[0]}x{crop[1]}"
    else:
        side = ctx.geometry.resized
        image_bytes, kind = side[0] * side[1] * 3, f"uint8 {side[0]}x{side[1]}x3"
    shallow = dataclasses.replace(ctx.options, prefetch_factor=1)
    return InFlight(
        loader=name,
        n_workers=ctx.n_workers,
        per_worker=_ready(spec, ctx.options),
        extra=loop_holds + _received(spec, ctx.options),
        batch_size=ctx.batch_size,
        image_bytes=image_bytes,
        kind=kind,
        ranks=ctx.world.local_world_size,
        thread_option="loader.method=thread" if hasattr(ctx.options, "method") else "",
        # The same with loader.prefetch_factor=1, where that is fewer.
        shallow=ctx.n_workers * _ready(spec, shallow) + loop_holds + _received(spec, shallow),
    )


def _ready(spec: LoaderSpec, options: LoaderConfig) -> int:
    return spec.ready_per_worker(options) if spec.ready_per_worker else options.prefetch_factor


def _received(spec: LoaderSpec, options: LoaderConfig) -> int:
    return spec.received_ahead(options) if spec.received_ahead else 0


def threaded() -> list[str]:
    """The loaders whose workers are threads of the loop's process (no shared memory)."""
    return [
        name
        for name in names(real_only=True)
        if get(name).available() and get(name).traits_for().workers != Workers.process
    ]


def register(name: str, spec: LoaderSpec) -> None:
    """Add a loader that lives outside facebench/loaders/, from Python (a plugin, a test):
    `loader=<name>` then composes (its options schema with their defaults) and every list of
    loaders has it. A pipeline of your own needs none of this: `loader=custom
    loader.dataset._target_=mymodule.MyDataset` (docs/own-pipeline.md)."""
    _registered[name] = spec
    ConfigStore.instance().store(group="loader", name=name, node=spec.options(name=name))


def register_schemas() -> None:
    """Store each loader's options schema as `schema/loader/<name>` for its YAML file to name
    (a group of their own: in `loader`, they would be listed as choices)."""
    store = ConfigStore.instance()
    for name in names():
        store.store(group="schema/loader", name=name, node=get(name).options)


def context(
    cfg: TrainConfig,
    spec: LoaderSpec,
    listing: Listing,
    device: torch.device,
    world: World | None = None,
) -> LoaderContext:
    """What the configured loader gets to build its pipeline from: the data as the run listed
    and checked it once, before any clock, and the settings it may use."""
    shard_format = spec.format_for(cfg.loader)
    shards: Path | str | None = None
    if shard_format is not None and in_bucket(str(listing.root)):
        shards = bucket_folder(cfg.storage.url, shard_format)  # uploaded by prepare.py
    elif shard_format is not None:
        shards = shards_root(cfg.shards_dir, Path(listing.root), shard_format)
    geometry = Geometry.of(cfg.transform)
    return LoaderContext(
        options=cfg.loader,
        listing=listing,
        batch_size=cfg.batch_size,
        n_workers=cfg.n_workers,
        seed=cfg.seed,
        device=device,
        # Timed as the transform stage where a loader applies it (loaders/decoding.py).
        transform=article_transform(cfg.loader.crop, geometry),
        shards_dir=shards,
        shard_size=cfg.shard_size,
        row_group_size=cfg.row_group_size,
        world=world or World(),
        on_bad_sample=cfg.on_bad_sample,
        verify_shards=cfg.verify_shards,
        cache=cache_dir(cfg.data.cache_dir),
        layout=data_layout(cfg.data),
        geometry=geometry,
    )
