"""A user's own pipeline as a loader (loader=custom): any Dataset, IterableDataset, DataLoader
or iterable of batches, named by its Hydra `_target_` and measured without a line of it
changed (facebench/custom/).

A Dataset or IterableDataset goes into facebench's DataLoader, so that n_workers, batch_size,
prefetch_factor, pinning and shuffling apply (and sweep) as for any loader; a DataLoader or an
iterable of batches is used as it is, and the run says which of those keys it could not apply.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from facebench.config import LoaderConfig, Workers
from facebench.custom import target
from facebench.custom.attach import attach, nested
from facebench.custom.carrier import Carrier
from facebench.custom.checks import Observed
from facebench.custom.probes import TimedSamples, TimedStream, instrument
from facebench.custom.target import Built, Kind
from facebench.data.job_data import JobData
from facebench.data.listing import Listing, Usable
from facebench.data.records import LabelSpace
from facebench.errors import ConfigError
from facebench.host.resources import WORKER_OWN_BYTES
from facebench.loaders.custom_batches import Unwrapped
from facebench.loaders.plan import epoch_seed
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits

log = logging.getLogger(__name__)


@dataclass
class Options(LoaderConfig):
    # Your Dataset, IterableDataset or DataLoader: `_target_` (a class or a function, in the
    # launch directory or on PYTHONPATH) and its arguments.
    dataset: Any = field(default_factory=lambda: {"_target_": "???"})
    # Your collate function (`_target_`), for a Dataset or IterableDataset; null: torch's.
    collate_fn: Any = field(default_factory=lambda: {"_target_": None})
    # The dict key or tuple index of the tensor a batch is counted by; "": the first tensor.
    batch_size_from: str = ""
    # A map-style Dataset's order: reshuffled each epoch (DataLoader(shuffle=True)), or as is.
    shuffle: bool = True


@dataclass(frozen=True)
class Own:
    """The user's pipeline, built and checked before any clock."""

    built: Built
    name: str  # loader=<name>
    collate: Callable[[Any], Any] | None
    key: str  # loader.batch_size_from
    for_model: bool  # a model trains on its batches: they must be images and labels

    def job_data(self) -> JobData:
        """The run's data, as facebench records it: no records (its samples are its own), its
        classes where it has them, the time it took to build."""
        labels = LabelSpace(classes=self.built.classes())
        return JobData(Listing(self.built.target, [], labels, Usable([], [])), self.built.build_s)

    def label(self) -> str:
        """The runs view's data_set: whose data."""
        length = self.built.length()
        return f"own {self.built.target}" + (f" {length:,}" if length is not None else "")


def own(cfg: Any) -> Own:
    """Build the user's pipeline from cfg.loader (a TrainConfig's), and check it fits the run."""
    options = cfg.loader
    built = target.build(options.dataset)
    collate = target.collate_fn(options.collate_fn)
    trains = cfg.model != "none" and not cfg.host_only and cfg.accelerator.name == "none"
    mine = Own(built, options.name, collate, str(options.batch_size_from), trains)
    length = built.length()
    if trains and not built.classes():
        raise ConfigError(
            f"loader=custom with model={cfg.model}: the model's last layer needs the number of "
            f"classes, and {built.target} has no `classes` list (ImageFolder's); give it one, "
            "or measure the loader alone: model=none host_only=true, or accelerator=h100"
        )
    log.info(
        "loader=%s: %s from %s (%s samples), built in %.2f s; its samples are not checked "
        "(each once, labels, pixels: facebench has no records of them)",
        options.name,
        built.kind.value,
        built.target,
        f"{length:,}" if length is not None else "an unknown number of",
        built.build_s,
    )
    if built.kind in (Kind.loader, Kind.batches):
        _say_unapplied(cfg, built)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and built.kind != Kind.map:
        log.warning(
            "loader=%s: %s gives a %s, which facebench cannot split between the job's ranks: "
            "every rank reads all of it unless it splits itself by rank",
            options.name,
            built.target,
            built.kind.value,
        )
    elif built.kind == Kind.map and length is None:
        raise ConfigError(
            f"loader.dataset._target_={built.target}: its Dataset has no __len__, which a "
            "DataLoader's sampler needs; give it one, or make it an IterableDataset"
        )
    elif length is not None and length < cfg.batch_size and built.kind == Kind.map:
        raise ConfigError(
            f"batch_size={cfg.batch_size} is larger than the {length:,} samples of "
            f"{built.target}; with drop_last no batch would be delivered. Use a smaller batch_size"
        )
    return mine


def _say_unapplied(cfg: Any, built: Built) -> None:
    """A pipeline used as it is: which of the run's keys it did not take, in one line."""
    if built.kind == Kind.batches:
        log.warning(
            "loader=%s: %s gave an iterable of batches, used as it is: n_workers, batch_size, "
            "prefetch_factor and pinning are its own, not the run's; each batch is timed as a "
            "whole (return a Dataset to have facebench time inside its workers)",
            cfg.loader.name,
            built.target,
        )
        return
    loader: DataLoader = built.pipeline
    theirs = {
        "n_workers": (cfg.n_workers, loader.num_workers),
        "batch_size": (cfg.batch_size, _batch_size(loader)),
        "loader.prefetch_factor": (
            cfg.loader.prefetch_factor,
            loader.prefetch_factor if loader.num_workers else cfg.loader.prefetch_factor,
        ),
    }
    differ = [f"{key}={mine} (it has {its})" for key, (mine, its) in theirs.items() if mine != its]
    own_keys = cfg.loader.collate_fn and cfg.loader.collate_fn.get("_target_")
    differ += ["loader.collate_fn (it has its own)"] if own_keys else []
    if differ:
        log.warning(
            "loader=%s: %s gave a DataLoader, used as it is: its own settings are measured, "
            "not the run's %s",
            cfg.loader.name,
            built.target,
            ", ".join(differ),
        )


def _batch_size(loader: DataLoader) -> int | str:
    if loader.batch_size is not None:
        return loader.batch_size
    return getattr(loader.batch_sampler, "batch_size", None) or "its own batches"


def build(ctx: LoaderContext) -> Iterable[Batch]:
    mine: Own = ctx.own
    built = mine.built
    observed = Observed(mine.name, ctx.n_workers, _iterable(built), built.length())
    if built.kind == Kind.batches:
        return Unwrapped(built.pipeline, observed, mine.key, mine.for_model)
    if built.kind == Kind.loader:
        loader = built.pipeline
        observed.n_workers = loader.num_workers
        attach(loader)  # for good: the same DataLoader every epoch
        return Unwrapped(loader, observed, mine.key, mine.for_model)
    for dataset in nested(built.dataset):  # a Subset's or ConcatDataset's transforms too
        instrument(dataset)
    return Unwrapped(_data_loader(ctx, mine, observed), observed, mine.key, mine.for_model)


def _data_loader(ctx: LoaderContext, mine: Own, observed: Observed) -> DataLoader:
    """facebench's DataLoader over the user's dataset: the run's settings, drop_last as the
    article's; each epoch's order from the run's seed and the epoch."""
    built, options = mine.built, ctx.options
    generator = torch.Generator()
    generator.manual_seed(epoch_seed(ctx.seed, ctx.epoch) + ctx.world.rank)
    extra: dict[str, Any] = {}
    if ctx.n_workers > 0:
        extra["prefetch_factor"] = options.prefetch_factor
    if built.kind == Kind.iterable:
        dataset, shuffle, sampler = TimedStream(built.pipeline), None, None
    elif ctx.world.distributed:  # each rank its share, as DistributedSampler gives
        dataset, shuffle = TimedSamples(built.pipeline), None
        sampler = DistributedSampler(
            dataset, ctx.world.world_size, ctx.world.rank, options.shuffle, ctx.seed
        )
        sampler.set_epoch(ctx.epoch)
    else:
        dataset, shuffle, sampler = TimedSamples(built.pipeline), options.shuffle, None
    return DataLoader(
        dataset,
        batch_size=ctx.batch_size,
        shuffle=shuffle,
        sampler=sampler,
        drop_last=True,
        num_workers=ctx.n_workers,
        pin_memory=ctx.pin_memory,
        generator=generator,
        collate_fn=Carrier(mine.collate, digest=observed.iterable and ctx.n_workers > 1),
        **extra,
    )


def _iterable(built: Built) -> bool:
    return built.kind == Kind.iterable or (
        built.kind == Kind.loader and isinstance(built.dataset, torch.utils.data.IterableDataset)
    )


def worker_memory(ctx: LoaderContext) -> int:
    return WORKER_OWN_BYTES  # its batches' size is known once they are made


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=Traits(Handover.own, Pixels.own, Workers.process),
    own=own,
    bucket_refusal=(
        "your dataset reads its data itself, from wherever its arguments say; storage= "
        "applies to facebench's loaders (leave storage at its default)"
    ),
)
