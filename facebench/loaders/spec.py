"""The loader contract: everything about a loader, in one typed object.

Each module in facebench/loaders/ named by a YAML file in conf/loader/ defines

    LOADER = LoaderSpec(options=..., build=..., worker_memory=..., traits=..., ...)

and the runner, the tests, the report, advise and the benchmarks ask it, and nothing else,
what the loader is: adding a loader is one module and one YAML file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from facebench.config import LoaderConfig, Workers
from facebench.errors import ConfigError
from facebench.host.extras import Requirement
from facebench.loaders.shardsets import ensure_loader_shards, shard_files
from facebench.loaders.shared import Batch, LoaderContext
from facebench.storage.address import in_bucket


class Handover(StrEnum):
    normalized = "normalized"  # float (n, 3, crop, crop), normalized: what the model takes
    uint8 = "uint8"  # (n, resize, resize, 3) uint8 and crop offsets: the device finishes them
    own = "own"  # a user's own batches (loader=custom), as its pipeline makes them


class Pixels(StrEnum):
    exact = "exact"  # pixel for pixel the article's preprocessing (PIL)
    close = "close"  # other decoders or resampling (torchvision.io, DALI): within a few levels
    own = "own"  # a user's own preprocessing (loader=custom)


@dataclass(frozen=True)
class Traits:
    """What a loader hands over, how faithful its pixels are, where its work runs."""

    handover: Handover
    pixels: Pixels
    workers: Workers


@dataclass(frozen=True)
class LoaderSpec:
    """One loader: its options schema, how it builds an epoch, its traits, what it needs first."""

    # The schema of cfg.loader (LoaderConfig or a subclass), checked when Hydra composes.
    options: type[LoaderConfig]
    # One epoch's batches; called inside the epoch clock, once per epoch.
    build: Callable[[LoaderContext], Iterable[Batch]]
    # Bytes one worker needs at most, for the check that n_workers fits this machine.
    worker_memory: Callable[[LoaderContext], int]
    # Its traits, or a function of its options that gives them (a decoder option, say).
    traits: Traits | Callable[[LoaderConfig], Traits]
    # The shard format (shards/formats.py) it reads, or a function of its options that gives
    # it: built before the clock when missing, and the files whose page cache `cache=`
    # controls. None: it reads the image files.
    shard_format: str | Callable[[LoaderConfig], str | None] | None = None
    # Whether each worker batches its own shards (one partial batch per worker may be dropped)
    # rather than the epoch being batched in one place; or a function of its options that says.
    batches_per_worker: bool | Callable[[LoaderConfig], bool] = False
    # A compute ceiling: no real samples, nothing to count, nothing read.
    ceiling: bool = False
    # Work before the first epoch, once per job, in place of building shard_format (its return
    # is logged as metrics).
    set_up: Callable[[LoaderContext], dict[str, float]] | None = None
    # What it holds for the whole job, inside the job's MLflow run and outside every epoch's
    # clock (a Ray cluster, started or joined): entered before the first epoch, left when the
    # job ends however it ends; it gives the job's metrics of it (its start-up time, say).
    session: Callable[[LoaderContext], AbstractContextManager[dict[str, float]]] | None = None
    # The Python package it needs, and the extra that installs it.
    requires: Requirement | None = None
    # Whether its batches carry the worker side's stage times (facebench/stages.py): False where
    # the work runs inside a library that lets none be timed (DALI's executor) or there is none.
    stage_times: bool = True
    # What its worker processes' shared memory holds at once, in batches (facebench/shared_memory):
    # each worker's ready ones (None: loader.prefetch_factor, as DataLoader's), and those it
    # keeps received ahead of the loop (torchdata.nodes' Prefetcher).
    ready_per_worker: Callable[[LoaderConfig], int] | None = None
    received_ahead: Callable[[LoaderConfig], int] | None = None
    # Whether its worker processes hand batches over through /dev/shm, as torch's queues do
    # (checked against its free space first). False for Ray's workers: Ray's object store
    # checks /dev/shm itself and goes to /tmp where it is too small.
    through_shared_memory: bool = True
    # Whether it reads its data from a bucket (storage=s3), and if not, why not: None where it
    # does, else the reason storage=s3 is refused for it, in a few words.
    bucket_refusal: str | None = "it does not read from a bucket yet"
    # Why it cannot read this machine's files (storage=local), where it cannot: None for most.
    local_refusal: str | None = None
    # The files an epoch reads where they are not its shards (a library's own copy of them,
    # whose page cache `cache=` controls); None: its shards', or the image files.
    epoch_files: Callable[[LoaderContext], list[str]] | None = None
    # The S3 client its library makes for itself (storage.client, which every other loader's
    # GETs go through, cannot change it); None: it reads through storage.client.
    own_client: str | None = None
    # A user's own pipeline (loader=custom): it reads data of its own, not the run's data=.
    # Called once per job, before any clock, in place of listing data=; what it returns
    # (built, checked) is the LoaderContext's `own`. None for facebench's loaders.
    own: Callable[[Any], Any] | None = None

    def traits_for(self, options: LoaderConfig | None = None) -> Traits:
        """Its traits with these options (its defaults when none are given)."""
        if isinstance(self.traits, Traits):
            return self.traits
        return self.traits(options if options is not None else self.options())

    def batches_per_worker_for(self, options: LoaderConfig | None = None) -> bool:
        """Whether its workers batch their own shards, with these options (its defaults when
        none are given)."""
        if callable(self.batches_per_worker):
            return self.batches_per_worker(options if options is not None else self.options())
        return self.batches_per_worker

    def format_for(self, options: LoaderConfig | None = None) -> str | None:
        """The shard format it reads with these options (its defaults when none are given)."""
        if callable(self.shard_format):
            return self.shard_format(options if options is not None else self.options())
        return self.shard_format

    def available(self) -> bool:
        return self.requires is None or self.requires.available()

    def require(self, name: str) -> None:
        """Refuse, with the install command, when its package is missing."""
        if self.requires is not None:
            self.requires.require(f"loader={name}")

    def reads(self, storage: str) -> bool:
        """Whether it reads data from this storage (local, s3)."""
        refusal = self.local_refusal if storage == "local" else self.bucket_refusal
        return refusal is None

    def check_storage(self, storage: str, name: str, client: str = "crt") -> None:
        """Refuse, in one line and before any request, a storage it cannot read, or an S3
        client it cannot read through."""
        if storage == "local" and self.local_refusal is not None:
            raise ConfigError(f"{name} with storage=local: {self.local_refusal}")
        if storage != "local" and self.bucket_refusal is not None:
            raise ConfigError(f"{name} with storage={storage}: {self.bucket_refusal}")
        if storage != "local" and self.own_client and client != "crt":
            raise ConfigError(
                f"{name} with storage.client={client}: its library reads through its own S3 "
                f"client ({self.own_client}), which storage.client cannot change. Leave "
                "storage.client at its default, or compare clients with a loader whose GETs "
                "are facebench's (dataset, nodes, datapipe, spdl, pickle, webdataset, raw)"
            )

    def set_up_job(self, ctx: LoaderContext) -> dict[str, float]:
        """Its preparation, once per job, outside the clock: by default, build its shards if
        missing."""
        if self.set_up is not None:
            return self.set_up(ctx)
        shard_format = self.format_for(ctx.options)
        return ensure_loader_shards(ctx, shard_format) if shard_format is not None else {}

    def held(self, ctx: LoaderContext) -> AbstractContextManager[dict[str, float]]:
        """Its session for the job (nothing, for most loaders)."""
        return self.session(ctx) if self.session is not None else nullcontext({})

    def data_files(self, ctx: LoaderContext) -> list[str]:
        """The files an epoch reads: its shards, or every image, or nothing."""
        if self.ceiling:
            return []
        if self.epoch_files is not None and (found := self.epoch_files(ctx)):
            return found
        if self.format_for(ctx.options) is not None:
            return shard_files(ctx)
        # Objects in a bucket have no page cache here to warm, evict or inspect.
        return [record.path for record in ctx.records if not in_bucket(record.path)]


def decoder_traits(workers: Workers = Workers.process) -> Callable[[LoaderConfig], Traits]:
    """Traits of a loader with a `decoder` option: pil runs the article's transform per sample;
    the others (torchvision, fast) decode into uint8 batches that the device finishes."""

    def traits(options: LoaderConfig) -> Traits:
        chosen = workers
        if getattr(options, "method", None) == Workers.thread:
            chosen = Workers.thread
        if options.decoder == "pil":
            return Traits(Handover.normalized, Pixels.exact, chosen)
        return Traits(Handover.uint8, Pixels.close, chosen)

    return traits
