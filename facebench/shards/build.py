"""Building a shard set: shuffle all samples once, decode them, write shards, manifest last.

Building is idempotent: when the manifest matches the current source files and settings and every
shard is in place, nothing is done. An interrupted build never leaves a folder that looks
complete, and the next build finishes it:

1. the old manifest is removed first, and a plan (the fingerprints and the shard list) is written;
2. each shard and its index are written under temporary names and renamed; then a small record of
   the finished shard (its size and hashes) is written, also atomically;
3. the manifest is written last, from those records.

A build that finds a plan equal to its own reuses every shard whose record exists and whose file
still has the recorded size; anything else is rewritten.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import numpy as np
from omegaconf import DictConfig

from facebench.atomic import remove_staging, write_atomic
from facebench.config import validate
from facebench.data.check import Listing, list_usable, source_fingerprint
from facebench.data.images import CELEBA_BOX
from facebench.data.sources import FACES, Layout, Record
from facebench.data.transforms import ARTICLE
from facebench.errors import ConfigError, ShardError
from facebench.parallel import map_in_processes
from facebench.paths import cache_dir, check_writable, data_layout, data_root, shards_root
from facebench.progress import progress
from facebench.shards import litdata_format, pickle_format, raw_format, room, tar_format
from facebench.shards.manifest import (
    MANIFEST,
    Manifest,
    OutdatedManifest,
    ShardEntry,
    encode_index,
    read_verified,
)
from facebench.tracking import write_results

log = logging.getLogger(__name__)

FORMATS: dict[str, ModuleType] = {
    "pickle": pickle_format,
    "raw": raw_format,
    "tar": tar_format,
    "litdata": litdata_format,
}
_SHARD_PREFIX = "shard-"
_PLAN = ".plan.json"
_DONE = ".done"
_LOCK = ".lock"
_WAIT_LOG_S = 30  # how often a build that waits for another says so


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
    left_out = hashlib.sha256("\n".join(sorted(skipped or [])).encode()).hexdigest()
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


@contextmanager
def _building(folder: Path) -> Iterator[None]:
    """One builder per shard folder at a time (sweep jobs, prepare.py beside train.py, ranks):
    the others wait here, saying so, then find the set up to date."""
    check_writable(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / _LOCK, "a+") as lock:  # "a+": opening it changes nothing
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait_for(lock, folder)
        try:
            lock.truncate(0)
            lock.write(f"{os.getpid()}\n")  # who builds, for anyone who waits
            lock.flush()
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _wait_for(lock: IO[str], folder: Path) -> None:
    lock.seek(0)
    holder = lock.read().strip() or "another process"
    waited = 0.0
    while True:
        if waited % _WAIT_LOG_S == 0:
            log.info(
                "waiting for %s building shards in %s to finish (%.0f s so far; lock file %s)",
                f"process {holder}" if holder.isdigit() else holder,
                folder,
                waited,
                folder / _LOCK,
            )
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(1.0)
            waited += 1.0


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
    with _building(folder):
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
    plan = _plan(
        usable.records, settings["seed"], settings["shard_size"], module, fingerprint, settings
    )
    needed = _needed_bytes(folder, module, plan, usable.records)
    if module.WHOLE_SET:
        shards = _write_whole_set(folder, module, plan, usable.records, n_procs, cache, needed)
    else:
        room.check_room(folder, needed, room.bytes_in(folder, _SHARD_PREFIX))
        done = _start_or_resume(folder, plan.as_json())
        _write_missing(folder, shard_format, plan, done, usable.records, n_procs, needed)
        shards = [done[name] for name in plan.names]
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
    (folder / _PLAN).unlink(missing_ok=True)
    shutil.rmtree(folder / _DONE, ignore_errors=True)
    log.info(
        "wrote %d shards (%d samples, %s) to %s in %.1f s",
        len(plan.names),
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
class _Plan:
    """Which samples go to which shard: one shuffle of all samples, cut into shard_size."""

    fingerprint: str
    settings: dict[str, Any]
    names: list[str]
    chunks: list[np.ndarray]

    def as_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "settings": self.settings, "shards": self.names}


def _plan(
    records: list[Record],
    seed: int,
    shard_size: int,
    module: ModuleType,
    fingerprint: str,
    settings: dict[str, Any],
) -> _Plan:
    order = np.random.default_rng(seed).permutation(len(records))
    chunks = [order[start : start + shard_size] for start in range(0, len(records), shard_size)]
    names = [f"{_SHARD_PREFIX}{index:05d}{module.SUFFIX}" for index in range(len(chunks))]
    return _Plan(fingerprint, settings, names, chunks)


def _needed_bytes(folder: Path, module: ModuleType, plan: _Plan, records: list[Record]) -> int:
    sizes = [len(chunk) for chunk in plan.chunks]
    shard_bytes = module.estimate_bytes(sizes, records, _resize(plan.settings))
    return room.set_bytes(shard_bytes, len(records), room.block_size(folder))


def _write_missing(
    folder: Path,
    shard_format: str,
    plan: _Plan,
    done: dict[str, ShardEntry],
    records: list[Record],
    n_procs: int,
    needed: int,
) -> None:
    """Write the shards not done yet (in processes), adding each to `done` as it is finished."""
    tasks = [
        (
            shard_format,
            str(folder),
            name,
            [(int(i), records[i]) for i in chunk],
            _resize(plan.settings),
        )
        for name, chunk in zip(plan.names, plan.chunks, strict=True)
        if name not in done
    ]
    log.info(
        "writing %d samples into %d %s shards in %s (%d to write, %d processes)",
        len(records),
        len(plan.names),
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
        remove_staging(folder)
        remove_staging(folder / _DONE)
        raise room.disk_full(folder, needed, len(done), len(plan.names)) from None


def _write_whole_set(
    folder: Path,
    module: ModuleType,
    plan: _Plan,
    records: list[Record],
    n_procs: int,
    cache: Path | None,
    needed: int,
) -> list[ShardEntry]:
    """A format written in one go by its own library (litdata): the folder emptied of an older
    set first, then every sample in the plan's shuffled order."""
    existing = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name != _LOCK)
    room.check_room(folder, needed, existing)
    (folder / MANIFEST).unlink(missing_ok=True)  # not a shard set until the new manifest
    for path in folder.iterdir():
        if path.name != _LOCK:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    order = np.concatenate(plan.chunks) if plan.chunks else np.array([], dtype=np.int64)
    samples = [(int(i), records[i]) for i in order]
    log.info("writing %d samples with %s into %s", len(samples), module.__name__, folder)
    try:
        return module.write_set(
            samples, folder, n_procs, cache or cache_dir(), _resize(plan.settings)
        )
    except OSError as error:
        if error.errno in room.DISK_FULL:
            raise room.disk_full(folder, needed, 0, 1) from None
        raise


def _start_or_resume(folder: Path, plan: dict[str, Any]) -> dict[str, ShardEntry]:
    """Shards already finished under this very plan; otherwise a clean folder and a new plan."""
    check_writable(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # From here on the folder is not a shard set until the new manifest is written.
    (folder / MANIFEST).unlink(missing_ok=True)
    plan_path = folder / _PLAN
    try:
        previous = json.loads(plan_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    if previous == plan:
        remove_staging(folder)  # from writers that were killed
        done = _finished_shards(folder)
        if done:
            log.info("%s: resuming an interrupted build; %d shards already done", folder, len(done))
        return done
    _remove_shards(folder)
    shutil.rmtree(folder / _DONE, ignore_errors=True)
    write_atomic(plan_path, json.dumps(plan).encode())
    return {}


def _finished_shards(folder: Path) -> dict[str, ShardEntry]:
    """The shards an interrupted build recorded as finished, whose bytes still match."""
    done = {}
    for record in (folder / _DONE).glob("*.json"):
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
    done = Path(folder) / _DONE
    done.mkdir(exist_ok=True)
    write_atomic(done / f"{name}.json", entry.to_json().encode())
    return entry


def _remove_shards(folder: Path) -> None:
    """Delete shard files (finished or half-written) of an earlier build; nothing else."""
    for path in folder.iterdir():
        if path.name.startswith((_SHARD_PREFIX, f".{_SHARD_PREFIX}")) and path.is_file():
            path.unlink()


def run_prepare(
    cfg: DictConfig,
    output_dir: Path | None = None,
    sweep_id: str | None = None,
    multirun: bool = False,
) -> ShardSet:
    """prepare.py: build the shards for the configured data, or say they are up to date."""
    validate(cfg)
    format_module(cfg.format)
    n_procs = max(cfg.n_workers, 1)
    root = data_root(cfg.data, n_procs=n_procs)
    folder = shards_root(cfg.shards_dir, root, cfg.format)
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
