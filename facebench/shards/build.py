"""Building a shard set: shuffle all samples once, decode them, write shards, manifest last.

Building is idempotent: when the manifest matches the current source files and settings and every
shard is in place, nothing is done (shards/freshness.py). An interrupted build never leaves a
folder that looks complete, and the next build finishes it (shards/write.py): the plan is
written first, the manifest last. Only files facebench wrote are ever deleted or overwritten
(shards/owned.py), and one build per folder runs at a time (shards/lock.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from facebench.config.schema import ROW_GROUP_SIZE
from facebench.data.listing import Listing, list_usable, source_fingerprint
from facebench.data.sources import FACES, Layout
from facebench.data.transforms import ARTICLE
from facebench.errors import ConfigError
from facebench.host.paths import cache_dir
from facebench.shards import copies, formats, owned, room
from facebench.shards.formats import resize_of
from facebench.shards.freshness import settings_for, up_to_date
from facebench.shards.lock import building
from facebench.shards.manifest import INDEX_SUFFIX, Manifest, OutdatedManifest
from facebench.shards.owned import Plan
from facebench.shards.plan import SERVED_READERS, cut, shard_size_for, workers_without_a_batch
from facebench.shards.write import start_or_resume, write_missing, write_whole_set

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardSet:
    folder: Path
    manifest: Manifest
    built: bool  # False when an existing, matching set was reused
    seconds: float  # time spent checking and (re)building
    skipped: int = 0  # samples left out by on_bad_sample=skip


def ensure_shards(
    root: Path,
    folder: Path,
    shard_format: str = "pickle",
    seed: int = 0,
    shard_size: int = 10_000,
    n_procs: int = 1,
    on_bad_sample: str = "raise",
    cache: Path | None = None,
    listing: Listing | None = None,
    layout: Layout = FACES,
    resize: int = ARTICLE.resize,
    row_group_size: int = ROW_GROUP_SIZE,
    readers: int | None = 1,
    batch_size: int = 1,
) -> ShardSet:
    """The shard set for the data at root, built into folder unless an up-to-date one is there.

    `listing`: the data as a run already listed and checked it (else listed here, as `layout`
    says). `readers`: the workers (all ranks) that will read the set; formats whose workers read
    whole shards get at least that many (shards/plan.shard_size_for), and each of those
    workers a whole batch of `batch_size`, or the build is refused with what to change. None
    (prepare.py, which cannot know): as many as plan.SERVED_READERS, or as the data has batches."""
    with building(folder):
        started = time.perf_counter()  # listing here, when it is done here, counts as prepare_s
        cache = cache or cache_dir()
        listing = listing or list_usable(root, on_bad_sample, cache, n_procs, layout)
        if formats.get(shard_format).per_worker:
            try:
                existing = Manifest.read(folder)
            except OutdatedManifest:
                existing = None
            built = int(existing.settings["shard_size"]) if existing is not None else None
            n_samples = len(listing.usable.records)
            shard_size = sized_for(n_samples, shard_size, readers, batch_size, shard_format, built)
        settings = settings_for(
            shard_format,
            seed,
            shard_size,
            sorted(listing.usable.excluded),
            resize,
            row_group_size,
        )
        return _ensure(folder, shard_format, settings, n_procs, cache, listing, started)


def sized_for(
    n_samples: int,
    shard_size: int,
    readers: int | None,
    batch_size: int,
    format_name: str,
    built: int | None,
) -> int:
    """The shard size a set read by `readers` workers is cut to (`built`: the existing set's,
    kept where it serves them); refused where some worker would get no batch."""
    if readers is None:  # prepare.py: it refuses nothing a train.py run may not need
        readers = max(1, min(SERVED_READERS, n_samples // batch_size))
    elif idle := workers_without_a_batch(n_samples, batch_size, readers):
        batches = n_samples // batch_size
        fewer = f"n_workers={batches}, or " if batches else ""  # none at all: no worker count
        raise ConfigError(
            f"{n_samples:,} samples make {batches} batch(es) of {batch_size}, too few for "
            f"{readers} workers (all ranks) that each batch the {format_name} shards they read: "
            f"{idle} would have nothing to do. Use {fewer}batch_size={max(1, n_samples // readers)}"
            f", or more data (with data=synthetic, data.n_images={readers * batch_size})"
        )
    size = shard_size_for(n_samples, shard_size, readers, built, batch_size)
    if size != shard_size:
        log.info(
            "shard_size=%d would give %d shard(s) of %d samples to %d workers; shards of %d "
            "instead, so that each worker reads its own",
            shard_size,
            -(-n_samples // shard_size),
            n_samples,
            readers,
            size,
        )
    return size


def _ensure(
    folder: Path,
    format_name: str,
    settings: dict[str, Any],
    n_procs: int,
    cache: Path,
    listing: Listing,
    started: float,
) -> ShardSet:
    shard_format = formats.get(format_name)
    usable, labels = listing.usable, listing.labels
    fingerprint = source_fingerprint(listing.records, listing.root)
    existing = up_to_date(folder, fingerprint, settings)
    if existing is not None:
        return ShardSet(folder, existing, False, time.perf_counter() - started, len(usable.skipped))
    records, resize = usable.records, resize_of(settings)
    shards_cut = cut(len(records), settings["seed"], settings["shard_size"], shard_format)
    plan = Plan(fingerprint, settings, shards_cut.names)
    needed = shards_cut.needed_bytes(folder, shard_format, records, resize)
    if shard_format.whole_set:
        samples = [(int(i), records[i]) for i in shards_cut.order()]
        shards = write_whole_set(
            folder, shard_format, plan, samples, n_procs, cache, needed, settings
        )
    else:
        plan.files = [f for name in shards_cut.names for f in (name, name + INDEX_SUFFIX)]
        done = start_or_resume(folder, plan, needed)
        write_missing(
            folder, shard_format, plan, shards_cut, done, records, n_procs, needed, settings
        )
        shards = [done[name] for name in shards_cut.names]
    manifest = Manifest(
        format=format_name,
        source_fingerprint=fingerprint,
        settings=settings,
        n_samples=len(records),
        n_classes=labels.n_classes,
        shards=shards,
        classes=list(labels.classes),
        prepare_s=time.perf_counter() - started,
    )
    manifest.write(folder)
    owned.finish(folder, plan)
    copies.forget(cache / copies.ARROW_COPIES, folder)  # made from the set this one replaced
    log.info(
        "wrote %d shards (%d samples, %s) to %s in %.1f s",
        len(shards),
        manifest.n_samples,
        room.gb(sum(entry.bytes for entry in manifest.shards)),
        folder,
        manifest.prepare_s,
    )
    return ShardSet(folder, manifest, True, manifest.prepare_s, len(usable.skipped))
