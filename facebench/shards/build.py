"""Building a shard set: shuffle all samples once, decode them, write shards, manifest last.

Building is idempotent: when the manifest matches the current source files and settings and every
shard is in place, nothing is done. An interrupted build never leaves a folder that looks
complete, and the next build finishes it:

1. a plan (the fingerprints, the shard list, and the files of the set it replaces) is written
   first, then the old manifest is removed, then the old set's files;
2. each shard and its index are written under temporary names and renamed; then a small record of
   the finished shard (its size and hashes) is written, also atomically;
3. the manifest is written last, from those records.

A build that finds a plan equal to its own reuses every shard whose record exists and whose bytes
still hash as recorded; anything else is rewritten. Only files facebench wrote are ever deleted
or overwritten (facebench/shards/owned.py): the user's own files in the folder stay. One build
per folder runs at a time (facebench/shards/lock.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from omegaconf import DictConfig

from facebench.atomic import write_atomic
from facebench.config import validate
from facebench.data.check import Listing, list_usable, source_fingerprint
from facebench.data.images import CELEBA_BOX, set_max_pixels
from facebench.data.sources import FACES, Layout, Record
from facebench.data.transforms import ARTICLE
from facebench.errors import ConfigError, Interrupted, ShardError, interruption
from facebench.parallel import map_in_processes
from facebench.paths import cache_dir, data_layout, data_root, shards_root
from facebench.progress import progress
from facebench.shards import litdata_format, owned, pickle_format, raw_format, room, tar_format
from facebench.shards.lock import building
from facebench.shards.manifest import (
    INDEX_SUFFIX,
    MANIFEST,
    Manifest,
    OutdatedManifest,
    ShardEntry,
    encode_index,
    read_verified,
)
from facebench.shards.owned import DONE, Plan
from facebench.tracking import write_results

log = logging.getLogger(__name__)

FORMATS: dict[str, ModuleType] = {
    "pickle": pickle_format,
    "raw": raw_format,
    "tar": tar_format,
    "litdata": litdata_format,
}
_SHARD_PREFIX = "shard-"
# Where a whole-set format's library writes before its files are moved in: facebench's own.
_STAGING = ".facebench-build"


@dataclass(frozen=True)
class ShardSet:
    folder: Path
    manifest: Manifest
    built: bool  # False when an existing, matching set was reused
    seconds: float  # time spent checking and (re)building
    skipped: int = 0  # samples left out by on_bad_sample=skip


def format_module(name: str) -> ModuleType:
    if name not in FORMATS:
        raise ConfigError(f"format={name}: use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def settings_for(
    shard_format: str,
    seed: int,
    shard_size: int,
    skipped: list[str] | None = None,
    resize: int = ARTICLE.resize,
) -> dict[str, Any]:
    """Everything besides the source files that decides what the shards hold."""
    left_out = hashlib.sha256(os.fsencode("\n".join(sorted(skipped or [])))).hexdigest()
    settings = {
        "format": shard_format,
        "seed": seed,
        "shard_size": shard_size,
        "celeba_box": list(CELEBA_BOX),
        "decoded_mode": "RGB",
        "skipped": left_out,
    }
    if format_module(shard_format).RESIZED:  # its records hold resized pixels
        settings["resize"] = resize
    return settings


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
) -> ShardSet:
    """The shard set for the data at root, built into folder unless an up-to-date one is there.

    `listing`: the data as a run already listed and checked it (else listed here, as `layout`
    says)."""
    with building(folder):
        started = time.perf_counter()  # listing here, when it is done here, counts as prepare_s
        listing = listing or list_usable(root, on_bad_sample, cache or cache_dir(), n_procs, layout)
        settings = settings_for(
            shard_format, seed, shard_size, sorted(listing.usable.excluded), resize
        )
        return _ensure_shards(folder, shard_format, settings, n_procs, cache, listing, started)


def _ensure_shards(
    folder: Path,
    shard_format: str,
    settings: dict[str, Any],
    n_procs: int,
    cache: Path | None,
    listing: Listing,
    started: float,
) -> ShardSet:
    module = format_module(shard_format)
    usable, labels = listing.usable, listing.labels
    fingerprint = source_fingerprint(listing.records, listing.root)
    existing = _up_to_date(folder, fingerprint, settings)
    if existing is not None:
        return ShardSet(folder, existing, False, time.perf_counter() - started, len(usable.skipped))
    cut = _cut(usable.records, settings["seed"], settings["shard_size"], module)
    plan = Plan(fingerprint, settings, cut.names)
    needed = _needed_bytes(folder, module, cut, usable.records, _resize(settings))
    if module.WHOLE_SET:
        shards = _write_whole_set(folder, module, plan, cut, usable.records, n_procs, cache, needed)
    else:
        plan.files = [f for name in cut.names for f in (name, name + INDEX_SUFFIX)]
        done = _start_or_resume(folder, plan, needed)
        _write_missing(folder, shard_format, plan, cut, done, usable.records, n_procs, needed)
        shards = [done[name] for name in cut.names]
    manifest = Manifest(
        format=shard_format,
        source_fingerprint=fingerprint,
        settings=settings,
        n_samples=len(usable.records),
        n_classes=labels.n_classes,
        shards=shards,
        classes=list(labels.classes),
        prepare_s=time.perf_counter() - started,
    )
    manifest.write(folder)
    owned.finish(folder, plan)
    log.info(
        "wrote %d shards (%d samples, %s) to %s in %.1f s",
        len(shards),
        manifest.n_samples,
        room.gb(sum(entry.bytes for entry in manifest.shards)),
        folder,
        manifest.prepare_s,
    )
    return ShardSet(folder, manifest, True, manifest.prepare_s, len(usable.skipped))


def _up_to_date(folder: Path, fingerprint: str, settings: dict[str, Any]) -> Manifest | None:
    """The folder's manifest if it describes these sources and settings and is complete."""
    try:
        existing = Manifest.read(folder)
    except OutdatedManifest as error:
        log.info("%s; rebuilding", str(error).split(". Rebuild", 1)[0])
        return None
    if existing is None:
        return None
    if not existing.matches(fingerprint, settings):
        log.info("%s: built from other source files or settings; rebuilding", folder)
        return None
    wrong = existing.missing_or_resized(folder)
    if wrong:
        log.warning("%s: %s missing or resized; rebuilding it", folder, ", ".join(wrong[:3]))
        return None
    log.info(
        "shards up to date in %s (%d shards, %d samples); nothing to do",
        folder,
        len(existing.shards),
        existing.n_samples,
    )
    return existing


@dataclass(frozen=True)
class _Cut:
    """Which samples go to which shard: one shuffle of all samples, cut into shard_size."""

    names: list[str]
    chunks: list[np.ndarray]

    def order(self) -> np.ndarray:
        """Every sample, in the shuffled order the shards hold them."""
        return np.concatenate(self.chunks) if self.chunks else np.array([], dtype=np.int64)


def _cut(records: list[Record], seed: int, shard_size: int, module: ModuleType) -> _Cut:
    order = np.random.default_rng(seed).permutation(len(records))
    chunks = [order[start : start + shard_size] for start in range(0, len(records), shard_size)]
    names = [f"{_SHARD_PREFIX}{index:05d}{module.SUFFIX}" for index in range(len(chunks))]
    return _Cut(names, chunks)


def _needed_bytes(
    folder: Path, module: ModuleType, cut: _Cut, records: list[Record], resize: int
) -> int:
    sizes = [len(chunk) for chunk in cut.chunks]
    shard_bytes = module.estimate_bytes(sizes, records, resize)
    return room.set_bytes(shard_bytes, len(records), room.block_size(folder))


def _start_or_resume(folder: Path, plan: Plan, needed: int) -> dict[str, ShardEntry]:
    """Shards already finished under this very plan; otherwise the files of the set it replaces
    (facebench's own, and nothing else) removed, and its plan written first."""
    previous = Plan.read(folder)
    if plan.same_build(previous):
        plan.replaces = previous.replaces
        (folder / MANIFEST).unlink(missing_ok=True)  # a kill may have come just before
        owned.remove(folder, set(plan.replaces) - set(plan.files))
        owned.remove_staging(folder, set(plan.files))  # from writers that were killed
        room.check_room(folder, needed, owned.bytes_of(folder, set(plan.files)))
        done = _finished_shards(folder, plan)
        if done:
            log.info("%s: resuming an interrupted build; %d shards already done", folder, len(done))
        return done
    ours = owned.owned(folder, previous)
    owned.refuse_in_the_way(folder, owned.in_the_way(folder, plan.files, ours))
    room.check_room(folder, needed, owned.bytes_of(folder, ours))
    plan.replaces = sorted(ours)
    plan.write(folder)  # first: from here on every file of facebench's is named in it
    # The folder is not a shard set until the new manifest is written.
    (folder / MANIFEST).unlink(missing_ok=True)
    owned.remove(folder, ours)
    return {}


def _write_missing(
    folder: Path,
    shard_format: str,
    plan: Plan,
    cut: _Cut,
    done: dict[str, ShardEntry],
    records: list[Record],
    n_procs: int,
    needed: int,
) -> None:
    """Write the shards not done yet (in processes), adding each to `done` as it is finished."""
    resize = _resize(plan.settings)
    tasks = [
        (shard_format, str(folder), name, [(int(i), records[i]) for i in chunk], resize)
        for name, chunk in zip(cut.names, cut.chunks, strict=True)
        if name not in done
    ]
    log.info(
        "writing %d samples into %d %s shards in %s (%d to write, %d processes)",
        len(records),
        len(cut.names),
        shard_format,
        folder,
        len(tasks),
        max(1, min(n_procs, os.cpu_count() or 1, len(tasks))),
    )
    written = map_in_processes(_write_shard, tasks, n_procs)
    try:
        for entry in progress(written, len(tasks), "writing shards", "shards", log):
            done[entry.name] = entry
    except OSError as error:
        if error.errno not in room.DISK_FULL:
            raise
        # Other writers may have been stopped half way: nothing of theirs stays to fill the disk.
        owned.remove_staging(folder, set(plan.files))
        raise room.disk_full(folder, needed, len(done), len(cut.names)) from None


def _write_whole_set(
    folder: Path,
    module: ModuleType,
    plan: Plan,
    cut: _Cut,
    records: list[Record],
    n_procs: int,
    cache: Path | None,
    needed: int,
) -> list[ShardEntry]:
    """A format written in one go by its own library (litdata), in the plan's shuffled order,
    into a staging folder; then the older set's files (facebench's, named in its manifest or
    plan) make way for the new ones, which are moved in. Nothing else in the folder is touched.
    """
    previous = Plan.read(folder)
    ours = owned.owned(folder, previous)
    # Names the library may choose, checked now rather than after a long build.
    owned.refuse_in_the_way(
        folder,
        [
            name
            for name in sorted(os.listdir(folder))
            if module.writes(name) and name not in ours and not (folder / name).is_dir()
        ],
    )
    room.check_room(folder, needed, owned.bytes_of(folder, ours))
    plan.replaces = sorted(ours)
    plan.write(folder)
    (folder / MANIFEST).unlink(missing_ok=True)  # not a shard set until the new manifest
    staging = folder / _STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a killed build's
    staging.mkdir()
    samples = [(int(i), records[i]) for i in cut.order()]
    log.info("writing %d samples with %s into %s", len(samples), module.__name__, folder)
    try:
        entries = module.write_set(
            samples, staging, n_procs, cache or cache_dir(), _resize(plan.settings)
        )
        names = sorted(path.name for path in staging.iterdir())
        owned.refuse_in_the_way(folder, owned.in_the_way(folder, names, ours))
        plan.files = names
        plan.write(folder)  # before the move: a kill half way leaves them named as facebench's
        owned.remove(folder, ours - set(names))
        for name in names:
            os.replace(staging / name, folder / name)
    except OSError as error:
        if error.errno in room.DISK_FULL:
            raise room.disk_full(folder, needed, 0, 1) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entries


def _finished_shards(folder: Path, plan: Plan) -> dict[str, ShardEntry]:
    """The shards an interrupted build of this plan recorded as finished, whose bytes still
    match."""
    done = {}
    for name in plan.shards:
        record = folder / DONE / f"{name}.json"
        try:
            entry = ShardEntry(**json.loads(record.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue
        # Re-hashed: a crash can leave a file of the right size that never got its bytes.
        try:
            read_verified(folder / entry.name, entry.sha256)
            read_verified(folder / entry.index_name, entry.index_sha256)
        except (ShardError, OSError):
            continue
        done[entry.name] = entry
    return done


def _resize(settings: dict[str, Any]) -> int:
    return int(settings.get("resize", ARTICLE.resize))


def _write_shard(task: tuple[str, str, str, list[tuple[int, Record]], int]) -> ShardEntry:
    shard_format, folder, name, samples, resize = task
    data = FORMATS[shard_format].encode(samples, resize)
    index = encode_index([i for i, _ in samples], [r.label for _, r in samples])
    entry = ShardEntry(
        name=name,
        samples=len(samples),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        index_sha256=hashlib.sha256(index).hexdigest(),
    )
    write_atomic(Path(folder) / entry.index_name, index)
    write_atomic(Path(folder) / name, data)
    done = Path(folder) / DONE
    done.mkdir(exist_ok=True)
    write_atomic(done / f"{name}.json", entry.to_json().encode())
    return entry


def run_prepare(
    cfg: DictConfig,
    output_dir: Path | None = None,
    sweep_id: str | None = None,
    multirun: bool = False,
) -> ShardSet:
    """prepare.py: build the shards for the configured data, or say they are up to date."""
    validate(cfg)
    format_module(cfg.format)
    set_max_pixels(cfg.data.max_pixels)  # before any worker is forked: they inherit it
    n_procs = max(cfg.n_workers, 1)
    root = data_root(cfg.data, n_procs=n_procs)
    folder = shards_root(cfg.shards_dir, root, cfg.format)
    try:
        shard_set = ensure_shards(
            root,
            folder,
            cfg.format,
            cfg.seed,
            cfg.shard_size,
            n_procs,
            on_bad_sample=cfg.on_bad_sample,
            cache=cache_dir(cfg.data.cache_dir),
            layout=data_layout(cfg.data),
            resize=cfg.transform.resize,
        )
    except BaseException as error:
        stop = interruption(error)
        if stop is None:
            raise
        outcome = (
            f"nothing was written to {folder} (format={cfg.format} is built whole; the next "
            "prepare.py starts it again)"
            if format_module(cfg.format).WHOLE_SET
            else f"shards finished so far in {folder} are kept; the next prepare.py resumes"
        )
        raise Interrupted.of(stop, outcome) from error
    verb = "built" if shard_set.built else "checked"
    log.info("%s %s in %.1f s", verb, folder, shard_set.seconds)
    if output_dir is not None:
        write_results(
            output_dir / "results.json",
            {
                "shards_dir": str(folder),
                "built": shard_set.built,
                "prepare_s": shard_set.seconds,
                "n_shards": len(shard_set.manifest.shards),
                "n_samples": shard_set.manifest.n_samples,
                "samples_skipped": shard_set.skipped,
            },
        )
    return shard_set
