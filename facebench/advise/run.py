"""advise's job: the data and a subset of it, the ceiling, each loader in turn, within the budget;
then the answer, written beside the run and logged to MLflow."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from facebench import loaders
from facebench.advise.answer import Advice
from facebench.advise.ceiling import Ceiling, measure_ceiling
from facebench.advise.chart import chart
from facebench.advise.measure import RUN_S, Measured, measure_loader, worker_counts
from facebench.advise.own import measure_own
from facebench.config import AdviseConfig
from facebench.costs import Prices
from facebench.data.job_data import JobData, list_data
from facebench.data.location import data_layout
from facebench.data.subset import subset_tree
from facebench.errors import ConfigError, FacebenchError
from facebench.host.paths import PROJECT_ROOT, cache_dir
from facebench.host.resources import allowance
from facebench.run.job import Job
from facebench.storage.distance import Distance, describe, emulated, in_effect
from facebench.tracking.store import REPORTS_EXPERIMENT
from facebench.tracking.tracker import Tracker

log = logging.getLogger("facebench.advise")

CEILING_SHARE = 0.15  # of the budget, at most, for the compute ceiling


def run_advise(
    cfg: AdviseConfig, output_dir: Path | None = None, **_: object
) -> tuple[Advice, Path]:
    """advise as a job: the answer, written to output_dir (and MLflow, unless tracking=false)."""
    advice = advise(cfg)
    out = record(advice, cfg.tracking, output_dir)
    return advice, out


def advise(cfg: AdviseConfig) -> Advice:
    """Measure the ceiling, then each loader, within budget_s; the answer."""
    started = time.perf_counter()
    if cfg.model == "none" and cfg.accelerator.name == "none":
        raise ConfigError(
            "model=none: advise finds the loaders that keep a model fed, so it needs one: "
            "model=resnet50 (the article's) on a GPU, model=resnet18 amp=off on a CPU, or an "
            "emulated accelerator (accelerator=h100)"
        )
    loaders.refuse_unknown(cfg.loaders, "loaders")
    counts = worker_counts(cfg.workers)
    allowed = allowance()
    if allowed.cores_limit:
        log.info("worker counts up to %d: the cores of the %s", allowed.cores, allowed.cores_limit)
    cfg = replace(cfg, n_workers=max(counts))  # what the resource check looks at
    deadline = started + cfg.budget_s
    job = Job.start(cfg)
    if loaders.get(cfg.loader.name).own is not None:  # the user's own pipeline, and remedies
        return _advise_own(cfg, job, started, deadline, counts)
    # A bucket's distance, where storage.* asks for one: the relay runs for the whole of advise.
    with emulated(cfg.storage, cache_dir(cfg.data.cache_dir), cfg.seed) as via:
        return _advise(cfg, job, started, deadline, counts, via)


def _advise(
    cfg: AdviseConfig, job: Job, started: float, deadline: float, counts: list[int], via: str
) -> Advice:
    full = list_data(cfg, job.world, via)
    cfg, data = _subset(cfg, full, job)
    share = min(CEILING_SHARE * cfg.budget_s, deadline - time.perf_counter())
    if job.accelerator is not None:
        ceiling = Ceiling.emulated(job.accelerator, cfg.batch_size)
    else:
        ceiling = measure_ceiling(cfg, job, data, share)
    device = _say_ceiling(cfg, job, ceiling)
    names = cfg.loaders or loaders.names(real_only=True)
    near = in_effect(cfg.storage, via)
    measured = _each_loader(
        names, cfg, job, data, counts, deadline, ceiling.images_per_s, via, near
    )
    return Advice(
        counts=counts,
        model=str(cfg.model),
        device=device,
        ceiling=ceiling.images_per_s,
        n_images=len(full.listing.usable.records),
        n_sample=len(data.listing.usable.records),
        measured=measured,
        seconds=time.perf_counter() - started,
        budget_s=cfg.budget_s,
        ceiling_s=ceiling.seconds,
        ceiling_note=ceiling.note(),
        accelerator_rate=job.accelerator.images_per_s if job.accelerator else 0.0,
        accelerator_name=job.accelerator.name if job.accelerator else "",
        accelerator_host_cpu=job.accelerator.host_cpu if job.accelerator else 1.0,
        storage=_storage_said(cfg, via),
        distance=near,
        requests_per_worker=cfg.storage.requests_per_worker,
        prices=Prices.of(cfg.cost, cfg.storage.name, cfg.accelerator.name),
        client=str(cfg.storage.client),
    )


def _say_ceiling(cfg: AdviseConfig, job: Job, ceiling: Ceiling) -> str:
    """Log the pace to keep; what keeps it (the device, or an emulated accelerator)."""
    device = f"an emulated {job.accelerator.name}" if job.accelerator else str(job.device)
    trains = f"{cfg.model} trains" if job.accelerator is None else "the pace to keep"
    log.info(
        "compute ceiling: %s at %.0f images/s on %s%s",
        trains,
        ceiling.images_per_s,
        device,
        ceiling.note(),
    )
    return device


def _advise_own(
    cfg: AdviseConfig, job: Job, started: float, deadline: float, counts: list[int]
) -> Advice:
    """advise for the user's own pipeline (facebench/advise/own.py)."""
    share = min(CEILING_SHARE * cfg.budget_s, deadline - time.perf_counter())
    ceiling, measured, inside, n_images = measure_own(cfg, job, counts, deadline, share)
    accelerator = job.accelerator
    return Advice(
        counts=counts,
        model=str(cfg.model),
        device=_say_ceiling(cfg, job, ceiling),
        ceiling=ceiling.images_per_s,
        n_images=n_images,
        n_sample=n_images,
        measured=measured,
        seconds=time.perf_counter() - started,
        budget_s=cfg.budget_s,
        ceiling_s=ceiling.seconds,
        ceiling_note=ceiling.note(),
        accelerator_rate=accelerator.images_per_s if accelerator else 0.0,
        accelerator_name=accelerator.name if accelerator else "",
        accelerator_host_cpu=accelerator.host_cpu if accelerator else 1.0,
        inside=inside,
    )


def _storage_said(cfg: AdviseConfig, via: str) -> str:
    """Where the data were read: '' for local files; the bucket, and its distance if emulated."""
    if cfg.storage.name != "s3":
        return ""
    if via:
        return f"{cfg.storage.url}, at {describe(cfg.storage)} (emulated)"
    return f"{cfg.storage.url}, at {cfg.storage.endpoint or 'AWS'} as it answers"


def _subset(cfg: AdviseConfig, full: JobData, job: Job) -> tuple[AdviseConfig, JobData]:
    """The config and data advise measures with: the data itself, or a subset of it linked into
    the cache when it is larger than sample_images."""
    if cfg.storage.name == "s3":
        # Shard sets in a bucket are built from all of it (prepare.py storage=s3); each run is
        # cut short by the budget instead.
        log.info("the bucket's data are measured whole: sample_images applies to local data")
        return cfg, full
    layout = data_layout(cfg.data)
    listing = full.listing
    root = subset_tree(
        listing.root,
        listing.usable.records,
        cfg.sample_images,
        cache_dir(cfg.data.cache_dir),
        layout=layout,
        labels=listing.labels,
    )
    if root == listing.root:
        return cfg, full
    folder = layout.kind == "folder"
    data = replace(
        cfg.data,
        name="folder" if folder else "celeba_digiface",
        root=str(root),
        labels="labels.csv" if layout.labels else "",
    )
    cfg = replace(cfg, data=data)
    return cfg, list_data(cfg, job.world)


def _each_loader(
    names: list[str],
    cfg: AdviseConfig,
    job: Job,
    data: JobData,
    counts: list[int],
    deadline: float,
    ceiling: float,
    via: str,
    distance: Distance,
) -> list[Measured]:
    """Each loader in turn, in an equal share of the time left, at the bucket's `distance`
    where one is emulated."""
    measured = []
    for index, name in enumerate(names):
        share = (deadline - time.perf_counter()) / (len(names) - index)
        if share <= RUN_S[0]:
            measured.append(Measured(name, note="budget spent before it"))
            continue
        if not loaders.get(name).available():
            measured.append(Measured(name, note="not installed"))
            continue
        try:
            end = time.perf_counter() + share
            measured.append(
                measure_loader(name, cfg, job, data, counts, end, ceiling, via, distance)
            )
        except FacebenchError as error:
            measured.append(Measured(name, note=f"failed: {error}"))
    return measured


def record(advice: Advice, tracking: bool, out: Path | None = None) -> Path:
    """advice.md and advice.png in `out`, and one run of the facebench-reports experiment."""
    out = out or PROJECT_ROOT / "outputs" / "advise"
    out.mkdir(parents=True, exist_ok=True)
    (out / "advice.md").write_text(advice.markdown(), encoding="utf-8")
    if any(m.rates for m in advice.measured):
        chart(advice, out / "advice.png")
    tracker = Tracker(enabled=tracking, experiment=REPORTS_EXPERIMENT)
    params = {"model": advice.model, "device": advice.device, "n_images": advice.n_images}
    if advice.per_host:
        params["accelerator"] = advice.accelerator_name
    with tracker.run(advice.run_name, params, {"facebench.kind": "advise"}):
        tracker.log_metrics(
            {"ceiling_images_per_s": advice.ceiling}
            | {f"{m.name}_images_per_s": m.best()[1] for m in advice.measured if m.rates}
        )
        tracker.log_artifact(out / "advice.md")
        tracker.log_artifact(out / "advice.png")
    return out
