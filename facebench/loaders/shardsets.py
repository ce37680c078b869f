"""What the shard-reading loaders share: build missing shards, trust only a complete manifest."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from facebench.errors import ShardError
from facebench.loaders.shared import LoaderContext
from facebench.shards import formats
from facebench.shards.build import ensure_shards
from facebench.shards.in_bucket import trusted_bucket_set
from facebench.shards.manifest import Folder, Manifest, entry_name, entry_path

log = logging.getLogger(__name__)


def ensure_loader_shards(ctx: LoaderContext, shard_format: str) -> dict[str, float]:
    """Build the shards if missing or outdated (before the clock), cut so that each worker reads
    shards of its own (refused where the data cannot give each worker a batch). In a bucket,
    where prepare.py uploads them, they are checked, never built."""
    readers = max(ctx.n_workers, 1) * ctx.world.world_size  # every rank's workers
    if isinstance(ctx.shards_dir, str):
        manifest = trusted_bucket_set(
            ctx.shards_dir,
            ctx.listing,
            shard_format,
            seed=ctx.seed,
            shard_size=ctx.shard_size,
            resize=ctx.geometry.resize,
            row_group_size=ctx.row_group_size,
            readers=readers,
            batch_size=ctx.batch_size,
        )
        return _checked(ctx, manifest, shard_format, {})
    shard_set = ensure_shards(
        ctx.data_root,
        ctx.shards_dir,
        shard_format,
        seed=ctx.seed,
        shard_size=ctx.shard_size,
        row_group_size=ctx.row_group_size,
        n_procs=max(ctx.n_workers, 1),
        on_bad_sample=ctx.on_bad_sample,
        cache=ctx.cache,
        listing=ctx.listing,
        layout=ctx.layout,
        resize=ctx.geometry.resize,
        readers=readers,
        batch_size=ctx.batch_size,
    )
    built = {"prepare_s": shard_set.seconds} if shard_set.built else {}
    return _checked(ctx, shard_set.manifest, shard_format, built)


def _checked(
    ctx: LoaderContext, manifest: Manifest, shard_format: str, metrics: dict[str, float]
) -> dict[str, float]:
    """The set's metrics, after a full check of every shard's bytes where verify_shards asks."""
    if ctx.verify_shards:
        corrupted = manifest.corrupted(ctx.shards_dir)
        if corrupted:
            raise ShardError(
                f"{entry_path(ctx.shards_dir, corrupted[0])}: does not match the sha256 in its "
                f"manifest ({len(corrupted)} such shards). Rebuild: {_rebuild(ctx, shard_format)}"
            )
        log.info("verified %d shards against their manifest", len(manifest.shards))
    # The size built with, which may be below shard_size (shard_size_for): the run records it.
    metrics = {**metrics, "n_shards": float(len(manifest.shards))}
    if formats.get(shard_format).per_worker:
        metrics["shard_size_used"] = float(manifest.settings["shard_size"])
    return metrics


def _rebuild(ctx: LoaderContext, shard_format: str) -> str:
    """The command that makes the set again, where the run reads it from."""
    if isinstance(ctx.shards_dir, str):
        return f"python prepare.py storage=s3 format={shard_format} with the same settings"
    return f"delete {ctx.shards_dir}, then python prepare.py format={shard_format}"


def trusted_manifest(ctx: LoaderContext) -> Manifest:
    """The manifest of ctx.shards_dir, complete and with every shard the recorded size."""
    manifest = Manifest.read(ctx.shards_dir)
    storage = " storage=s3" if isinstance(ctx.shards_dir, str) else ""
    if manifest is None:
        raise ShardError(
            f"{ctx.shards_dir}: no complete shard set (no manifest.json). Run: python prepare.py"
            f"{storage} with the same data overrides"
        )
    wrong = manifest.missing_or_resized(ctx.shards_dir)
    if wrong:
        raise ShardError(
            f"{entry_path(ctx.shards_dir, wrong[0])}: missing or not the size its manifest "
            f"records ({len(wrong)} such shards). Rebuild: python prepare.py{storage} "
            f"format={manifest.format}"
        )
    return manifest


@dataclass(frozen=True)
class OpenShardSet:
    """A shard set as a loader reads it: its trusted manifest, and the guard that tells a damaged
    shard from a set rebuilt during the run."""

    folder: Folder  # a local folder, or an s3:// prefix
    manifest: Manifest
    guard: ShardGuard

    def paths(self) -> list[str]:
        return [str(entry_path(self.folder, shard.name)) for shard in self.manifest.shards]

    def sha256(self) -> dict[str, str]:
        return {shard.name: shard.sha256 for shard in self.manifest.shards}


def open_shard_set(ctx: LoaderContext, check: bool = True) -> OpenShardSet:
    """The run's shard set, checked against its manifest (and, for a set its library writes,
    against what facebench asks that library to write, unless `check` is false: a loader
    whose set-up checked it, before the clock, as a bucket's Parquet footers cost a GET each),
    ready to read."""
    manifest = trusted_manifest(ctx)
    check_set = formats.get(manifest.format).check_set
    if check and check_set is not None:
        check_set(ctx.shards_dir, manifest)
    return OpenShardSet(ctx.shards_dir, manifest, ShardGuard.of(ctx.shards_dir, manifest))


def shard_files(ctx: LoaderContext) -> list[str]:
    """The set's local files (whose page cache `cache=` controls); none for a bucket's."""
    if ctx.shards_dir is None or isinstance(ctx.shards_dir, str):
        return []
    manifest = Manifest.read(ctx.shards_dir)
    return [str(ctx.shards_dir / shard.name) for shard in manifest.shards] if manifest else []


class ShardsChanged(ShardError):
    """The shard set was rebuilt or removed while a run was reading it."""


@dataclass(frozen=True)
class ShardGuard:
    """Tells a shard that is damaged from a shard set that changed during the run.

    Built from the manifest the run started with; picklable, so workers carry it. When reading a
    shard fails (gone, or not the bytes the manifest promised), a manifest that is no longer the
    same means another process rebuilt the set: that is said in one line, not as a traceback.
    """

    folder: Folder
    digest: str

    @classmethod
    def of(cls, folder: Folder, manifest: Manifest) -> ShardGuard:
        return cls(folder, manifest.digest())

    def changed(self) -> bool:
        try:
            current = Manifest.read(self.folder)
        except ShardError:
            return True
        return current is None or current.digest() != self.digest

    @contextmanager
    def reading(self, path: str | Path) -> Iterator[None]:
        try:
            yield
        except (OSError, ShardError) as error:
            if self.changed():
                raise ShardsChanged(
                    f"{self.folder}: shards changed during the run ({entry_name(path)} is gone or "
                    "different): another prepare.py or train.py rebuilt them. Run again once it "
                    "has finished; runs that build shards at once need a shards_dir each"
                ) from None
            if isinstance(error, OSError):
                raise ShardError(
                    f"{path}: cannot read this shard ({error.strerror or error}). Rebuild: "
                    f"python prepare.py with the same settings"
                ) from None
            raise
