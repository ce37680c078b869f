"""Building a shard set: shuffle all samples once, decode them, write shards, manifest last.

Building is idempotent: when the manifest matches the current source files and settings and every
shard is in place, nothing is done. Each shard is written under a temporary name and renamed, and
the old manifest is removed before anything else changes, so an interrupted build never leaves a
folder that looks complete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from omegaconf import DictConfig

from facebench.config import validate
from facebench.data.images import CELEBA_BOX
from facebench.data.roots import check_writable, data_root, shards_root
from facebench.data.sources import Record, read_records
from facebench.errors import ConfigError, DataError
from facebench.progress import progress
from facebench.shards import pickle_format, raw_format, tar_format
from facebench.shards.manifest import MANIFEST, Manifest, ShardEntry, source_fingerprint
from facebench.tracking import write_results

log = logging.getLogger(__name__)

FORMATS: dict[str, ModuleType] = {"pickle": pickle_format, "raw": raw_format, "tar": tar_format}
_SHARD_PREFIX = "shard-"


@dataclass(frozen=True)
class ShardSet:
    folder: Path
    manifest: Manifest
    built: bool  # False when an existing, matching set was reused
    seconds: float  # time spent checking and (re)building

    def paths(self) -> list[Path]:
        return [self.folder / shard.name for shard in self.manifest.shards]


def format_module(name: str) -> ModuleType:
    if name not in FORMATS:
        raise ConfigError(f"format={name}: use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def settings_for(shard_format: str, seed: int, shard_size: int) -> dict[str, Any]:
    """Everything besides the source files that decides what the shards hold."""
    return {
        "format": shard_format,
        "seed": seed,
        "shard_size": shard_size,
        "celeba_box": list(CELEBA_BOX),
        "decoded_mode": "RGB",
        "sample": "image, label, id",
    }


def ensure_shards(
    root: Path,
    folder: Path,
    shard_format: str = "pickle",
    seed: int = 0,
    shard_size: int = 10_000,
    n_procs: int = 1,
) -> ShardSet:
    """The shard set for the data at root, built into folder unless an up-to-date one is there."""
    started = time.perf_counter()
    format_module(shard_format)
    records, labels = read_records(root)
    if not records:
        raise DataError(f"{root}: no images to write into shards")
    fingerprint = source_fingerprint(records, root)
    settings = settings_for(shard_format, seed, shard_size)
    existing = Manifest.read(folder)
    if existing is not None and existing.matches(fingerprint, settings):
        wrong = existing.missing_or_resized(folder)
        if not wrong:
            log.info(
                "shards up to date in %s (%d shards, %d samples); nothing to do",
                folder,
                len(existing.shards),
                existing.n_samples,
            )
            return ShardSet(folder, existing, built=False, seconds=time.perf_counter() - started)
        log.warning(
            "%s: %d shards missing or resized (%s...); rebuilding", folder, len(wrong), wrong[0]
        )
    elif existing is not None:
        log.info("%s: built from other source files or settings; rebuilding", folder)

    check_writable(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # From here on the folder is not a shard set until the new manifest is written.
    (folder / MANIFEST).unlink(missing_ok=True)
    _remove_shards(folder)

    order = np.random.default_rng(seed).permutation(len(records))
    tasks = [
        (
            shard_format,
            str(folder),
            index,
            [(int(i), records[i]) for i in order[start : start + shard_size]],
        )
        for index, start in enumerate(range(0, len(records), shard_size))
    ]
    n_procs = max(1, min(n_procs, os.cpu_count() or 1, len(tasks)))
    log.info(
        "writing %d samples into %d %s shards of up to %d in %s (%d processes)",
        len(records),
        len(tasks),
        shard_format,
        shard_size,
        folder,
        n_procs,
    )
    entries = list(
        progress(_write_all(tasks, n_procs), len(tasks), "writing shards", "shards", log)
    )
    manifest = Manifest(
        format=shard_format,
        source_fingerprint=fingerprint,
        settings=settings,
        n_samples=len(records),
        n_classes=labels.n_classes,
        shards=entries,
        prepare_s=time.perf_counter() - started,
    )
    manifest.write(folder)
    total_gb = sum(entry.bytes for entry in entries) / 1e9
    log.info(
        "wrote %d shards (%d samples, %.2f GB) to %s in %.1f s",
        len(entries),
        len(records),
        total_gb,
        folder,
        manifest.prepare_s,
    )
    return ShardSet(folder, manifest, built=True, seconds=manifest.prepare_s)


def _write_all(tasks: list, n_procs: int):
    if n_procs == 1:
        yield from map(_write_shard, tasks)
        return
    with ProcessPoolExecutor(max_workers=n_procs) as pool:
        yield from pool.map(_write_shard, tasks)


def _write_shard(task: tuple[str, str, int, list[tuple[int, Record]]]) -> ShardEntry:
    shard_format, folder, index, records = task
    module = FORMATS[shard_format]
    name = f"{_SHARD_PREFIX}{index:05d}{module.SUFFIX}"
    data = module.encode(records)
    staging = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
    with open(staging, "wb") as file:
        file.write(data)
    os.replace(staging, os.path.join(folder, name))
    return ShardEntry(
        name=name, samples=len(records), bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )


def _remove_shards(folder: Path) -> None:
    """Delete shard files (finished or half-written) of an earlier build; nothing else."""
    for path in folder.iterdir():
        if path.name.startswith((_SHARD_PREFIX, f".{_SHARD_PREFIX}")) and path.is_file():
            path.unlink()


def run_prepare(
    cfg: DictConfig, output_dir: Path | None = None, sweep_id: str | None = None
) -> ShardSet:
    """prepare.py: build the shards for the configured data, or say they are up to date."""
    validate(cfg)
    format_module(cfg.format)
    n_procs = max(cfg.n_workers, 1)
    root = data_root(cfg.data, n_procs=n_procs)
    folder = shards_root(cfg.shards_dir, root, cfg.format)
    shard_set = ensure_shards(root, folder, cfg.format, cfg.seed, cfg.shard_size, n_procs)
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
            },
        )
    return shard_set
