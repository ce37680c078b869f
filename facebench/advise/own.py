"""advise for a user's own pipeline (loader=custom, or a loader of theirs that starts from it):
the pipeline at more and more workers; which stage, or which transform by name, holds it; the
same images through facebench's loaders where they are an image folder facebench reads
(measured); and a transform moved to the device (an estimate)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from facebench import loaders, stages
from facebench.advise.ceiling import Ceiling, measure_ceiling
from facebench.advise.measure import Measured, measure_loader
from facebench.config import AdviseConfig
from facebench.custom.target import Built, Kind
from facebench.data.job_data import list_data
from facebench.errors import ConfigError, FacebenchError
from facebench.host.paths import cache_dir
from facebench.run.job import Job

log = logging.getLogger("facebench.advise")

# facebench's loaders tried on the user's images, where they are an image folder: the fastest
# of each kind here (pre-decoded records; pickled shards, as the article's third pipeline;
# tar shards).
REMEDIES = ("raw", "pickle", "webdataset")
OWN_SHARE = 0.5  # of the budget left after the ceiling, for the user's pipeline


def measure_own(
    cfg: AdviseConfig, job: Job, counts: list[int], deadline: float, ceiling_share: float
) -> tuple[Ceiling, list[Measured], list[str], int]:
    """The ceiling, the user's pipeline, and facebench's loaders on its images where it can
    read them; what was found inside it, as lines; the samples an epoch holds."""
    spec = loaders.get(cfg.loader.name)
    own = spec.own(replace(cfg, model="none", host_only=True))  # measured host side
    data = own.job_data()
    if job.accelerator is not None:
        ceiling = Ceiling.emulated(job.accelerator, cfg.batch_size)
    elif not own.built.classes():
        raise ConfigError(
            f"advise loader={cfg.loader.name}: the model's last layer needs the number of "
            f"classes, and {own.built.target} has no `classes` list; give it one, or advise "
            "against an emulated accelerator (accelerator=h100)"
        )
    else:
        ceiling = measure_ceiling(cfg, job, data, ceiling_share)
    counts = _counts_for(own.built, counts, cfg.loader.name)
    left = deadline - time.perf_counter()
    folder = image_folder(own.built.dataset)
    mine_until = time.perf_counter() + (left * OWN_SHARE if folder else left)
    mine = measure_loader(
        cfg.loader.name, cfg, job, data, counts, mine_until, ceiling.images_per_s, own=own
    )
    measured = [mine, *_remedies(cfg, job, folder, counts, deadline, ceiling.images_per_s)]
    return ceiling, measured, inside(mine, ceiling.images_per_s), own.built.length() or 0


def _counts_for(built: Built, counts: list[int], name: str) -> list[int]:
    """The worker counts to measure a pipeline at: advise's, where facebench makes the
    DataLoader; a user's own DataLoader runs its own workers, measured once."""
    if built.kind not in (Kind.loader, Kind.batches):
        return counts
    workers = built.pipeline.num_workers if built.kind == Kind.loader else 0
    log.info(
        "loader=%s is a %s with workers of its own: measured once as it is (n_workers=%d "
        "in the table); give a Dataset for advise to try 1, 2, 4, ... workers",
        name,
        built.kind.value,
        workers,
    )
    return [workers]


def image_folder(dataset: Any) -> Path | None:
    """The folder of class folders the dataset reads, where it is one facebench reads too
    (torchvision's ImageFolder and DatasetFolder keep it in `root`, and their samples in
    `samples`)."""
    root = getattr(dataset, "root", None)
    if root is None or not hasattr(dataset, "samples") or not Path(root).is_dir():
        return None
    return Path(root)


def _remedies(
    cfg: AdviseConfig, job: Job, folder: Path | None, counts: list[int], deadline: float,
    ceiling: float,
) -> list[Measured]:  # fmt: skip
    if folder is None:
        return []
    data_cfg = replace(cfg.data, name="folder", layout="folder", root=str(folder), labels="")
    # Not beside the images (shards_dir's default): a class folder to the user's ImageFolder.
    away = cfg.shards_dir or str(cache_dir(cfg.data.cache_dir) / "own-shards" / _key(folder))
    folder_cfg = replace(cfg, data=data_cfg, shards_dir=away)
    data = list_data(folder_cfg, job.world)
    log.info("the same images through facebench's loaders, from %s", folder)
    measured = []
    names = [name for name in REMEDIES if loaders.get(name).available()]
    for index, name in enumerate(names):
        end = time.perf_counter() + (deadline - time.perf_counter()) / (len(names) - index)
        try:
            measured.append(measure_loader(name, folder_cfg, job, data, counts, end, ceiling))
        except FacebenchError as error:
            measured.append(Measured(name, note=f"failed: {error}"))
    return measured


def _key(folder: Path) -> str:
    return hashlib.sha1(os.fsencode(str(folder.resolve()))).hexdigest()[:12]


def inside(mine: Measured, ceiling: float) -> list[str]:
    """Where the pipeline's workers spend their time, at its best worker count; and the rate a
    transform moved to the device would give, where it falls short (an estimate: the share of
    the workers' stage time that transform takes, freed)."""
    if not mine.rates:
        return []
    workers, rate = mine.best()
    metrics = mine.stages.get(workers, {})
    if "stage_load_cpu_us" not in metrics and "stage_transform_cpu_us" not in metrics:
        return [f"Inside {mine.name}: its batches were timed whole (an iterable of batches)."]
    load = metrics.get("stage_load_cpu_us", 0.0)
    waited = max(0.0, metrics.get("stage_load_us", 0.0) - load)
    transform = metrics.get("stage_transform_cpu_us", 0.0)
    named = stages.parts(metrics)
    listed = ", ".join(f"{name} {share:.0%}" for name, share in named[:6])
    lines = [
        f"Inside {mine.name} at n_workers={workers}, per image: its own sample code (reading "
        f"and decoding) {load:,.0f} us of CPU, {waited:,.0f} us more waiting (for storage or a "
        f"core); transforms {transform:,.0f} us"
        + (f" ({listed} of the workers' stage time)" if listed else "")
        + f"; collate {metrics.get('stage_collate_cpu_us', 0.0):,.0f} us."
    ]
    if named and rate < ceiling:
        name, share = named[0]
        freed = rate / max(1e-9, 1 - share)
        lines.append(
            f"Moving {name} to the device (a GPU transform on the batch) would free about "
            f"{share:.0%} of the workers' time: about {freed:,.0f} images/s with "
            f"{workers} workers, against {ceiling:,.0f} needed (an estimate, not measured)."
        )
    return lines
