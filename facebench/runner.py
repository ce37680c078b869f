"""One benchmark job, as its stages: prepare the data, build the loader, measure epochs, record.

config -> records -> loader -> epoch loop -> meter -> tracker (MLflow and results.json)
"""

from __future__ import annotations

import logging
import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from facebench import loaders, stages
from facebench.config import TrainConfig
from facebench.data.job_data import prepare_data
from facebench.data.records import LabelSpace
from facebench.distributed import World, barrier, gather, join, whole_job
from facebench.epoch import EpochSettings, run_epoch
from facebench.errors import Interrupted, interruption
from facebench.exactly_once import check_exactly_once
from facebench.job import Job
from facebench.loaders.base import LoaderContext
from facebench.loaders.spec import LoaderSpec
from facebench.meter import MIN_STEADY_BATCHES
from facebench.pagecache import prepare_cache, resident_fraction
from facebench.resources import check_workers
from facebench.tracking import Tracker, tracking_uri, ui_command, write_results
from facebench.training import Trainer, build_trainer

log = logging.getLogger(__name__)

# Metrics summarised over all measured epochs of a job (repeat x epochs) as _median, _min, _max.
HEADLINE = (
    "epoch_time_s",
    "images_per_s",
    "steady_images_per_s",
    "time_to_first_batch_s",
    "data_wait_frac",
)
# Metrics of the job rather than of an epoch: logged once.
ONCE = ("prepare_s", "samples_skipped", "listing_s", "n_shards", "shard_size_used")
_RESIDENCY_SAMPLE = 2000  # files checked with mincore to report the cache state


def run_training(
    cfg: TrainConfig,
    output_dir: Path | None = None,
    sweep_id: str | None = None,
    multirun: bool = False,
) -> dict[str, float]:
    """Run the configured epochs `repeat` times; return the last epoch's metrics and summaries."""
    job = Job.start(cfg)
    if cfg.model != "none" and job.world.is_main:
        log.info("precision: %s on %s", job.precision.describe(), job.device)
    # Only rank 0 records anything; the other ranks train and report their metrics to it.
    tracker = Tracker(enabled=cfg.tracking and job.world.is_main)
    output_dir = output_dir if job.world.is_main else None
    name, params, tags = job.name(cfg), job.params(cfg), job.tags(sweep_id)
    results: dict[str, Any] = {"run_name": name, "params": params, "tags": tags, "metrics": {}}
    with tracker.run(name, params, tags, system_metrics=True):
        results["status"] = "FAILED"
        results.update(_where_to_compare(tracker, sweep_id if multirun else None))
        try:
            _run(cfg, job, tracker, results)
            results["status"] = "FINISHED"
        except BaseException as error:
            stop = interruption(error)
            if stop is None:
                raise
            results["status"] = "KILLED"
            recorded = "marked KILLED in MLflow" if tracker.enabled else "stopped (tracking=false)"
            outcome = f"run {name} {recorded}; shards built so far are kept"
            raise Interrupted.of(stop, outcome) from error
        finally:
            # Written even when the job fails: nothing measured is lost.
            if output_dir is not None:
                write_results(output_dir / "results.json", results)
        if output_dir is not None:
            tracker.log_artifact(output_dir / "results.json")
            tracker.log_artifact(output_dir / ".hydra" / "config.yaml")
    if not multirun and "compare_url" in results:  # a sweep says it once, at its end
        log.info("every run side by side: %s", results["compare_url"])
        if results.get("ui_command"):
            log.info("(start the UI first: %s)", results["ui_command"])
    return results["metrics"]


def _where_to_compare(tracker: Tracker, sweep_id: str | None) -> dict[str, str]:
    """The MLflow UI's URL that shows this run's numbers beside the others' (a sweep's own
    view, or every run), and the command that starts the UI; nothing without tracking."""
    if tracker.url() is None:
        return {}
    if sweep_id:
        key, search = f"sweep-{sweep_id}", f"tags.sweep_id = '{sweep_id}'"
        url = tracker.share_view(key, key, search)
    else:
        url = tracker.url()
    return {"compare_url": url or "", "ui_command": ui_command(tracking_uri())}


def _run(cfg: TrainConfig, job: Job, tracker: Tracker, results: dict[str, Any]) -> None:
    _seed_everything(cfg.seed)
    data = prepare_data(cfg, job.world)
    metrics: dict[str, float] = results["metrics"]
    metrics.update(data.metrics())
    labels = data.listing.labels
    if labels.classes:  # folder data: which class each label index stands for
        results["classes"] = labels.class_map()
        tracker.log_dict(results["classes"], "classes.json")
    loader = loaders.get(cfg.loader.name)
    ctx = loaders.context(cfg, loader, data.listing, job.device, job.world)
    metrics.update(prepare_loader(cfg, loader, ctx, job.world))
    if "shard_size_used" in metrics:  # beside shard_size, which it may be smaller than
        tracker.log_params({"shard_size_used": int(metrics["shard_size_used"])})
    data_set = data_label(cfg, ctx.data_root, len(ctx.records))
    results["tags"]["data_set"] = data_set  # the runs view's column: which data, how much
    tracker.set_tags({"data_set": data_set})
    trainer = trainer_for(cfg, job, labels)
    log.info(
        "data %s (%d samples, %d classes), loader=%s, model=%s%s, %s on %s, cache=%s",
        ctx.data_root,
        len(ctx.records),
        labels.n_classes,
        cfg.loader.name,
        cfg.model,
        " (host only)" if cfg.host_only else "",
        job.precision.name,
        job.device,
        cfg.cache,
    )
    per_epoch = measure(cfg, job, loader, ctx, trainer, tracker)
    summary = summarise(per_epoch)
    metrics.update({**per_epoch[-1], **summary})  # the last epoch's, and the summaries
    tracker.log_metrics({**summary, **{k: v for k, v in metrics.items() if k in ONCE}})
    label = stages.dominant_label(metrics)
    if label:  # the runs table shows where the workers' time went
        results["tags"]["dominant_stage"] = label
        tracker.set_tags({"dominant_stage": label})
    if data.skipped:
        log.warning("on_bad_sample=skip: %d samples were left out (samples_skipped)", data.skipped)


def data_label(cfg: TrainConfig, root: Path, n_samples: int) -> str:
    """'synthetic 6,000', 'synthetic folder 10,000', 'folder mine 3,000': the data set a run
    read, so that runs on different sets with the same name are told apart."""
    name = cfg.data.name
    if name == "folder":
        name = f"folder {root.name}"
    elif name == "synthetic" and cfg.data.layout != "faces":
        name = f"synthetic {cfg.data.layout}"
    return f"{name} {n_samples:,}"


def prepare_loader(
    cfg: TrainConfig, loader: LoaderSpec, ctx: LoaderContext, world: World
) -> dict[str, float]:
    """The loader's preparation, once per job, outside the clock: its library checked first,
    its shards built if missing; then the check that its workers fit this machine. Rank 0
    first: it builds what the others then reuse."""
    loader.require(cfg.loader.name)
    metrics = loader.prepare_job(ctx)
    if world.is_main:
        barrier(world)
    check_workers(
        cfg.loader.name,
        cfg.n_workers,
        loader.worker_memory(ctx),
        processes_per_machine=world.local_world_size,
        enabled=cfg.resource_check,
    )
    return metrics


def trainer_for(cfg: TrainConfig, job: Job, labels: LabelSpace) -> Trainer | None:
    if cfg.model == "none":
        return None
    return build_trainer(
        cfg.model,
        labels.n_classes,
        job.device,
        job.precision,
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        distributed=job.world.distributed,
    )


def measure(
    cfg: TrainConfig,
    job: Job,
    loader: LoaderSpec,
    ctx: LoaderContext,
    trainer: Trainer | None,
    tracker: Tracker,
) -> list[dict[str, float]]:
    """Every measured epoch (repeat x epochs), each checked and logged as it ends."""
    files = loader.data_files(ctx)
    labels = [record.label for record in ctx.records]
    settings = EpochSettings(
        device=job.device,
        geometry=ctx.geometry,
        max_batches=cfg.max_batches,
        sample_hz=cfg.sample_hz,
        label_counts=np.bincount(labels, minlength=ctx.labels.n_classes),
        expected_images=len(ctx.records) if not cfg.max_batches else None,
        join=join(trainer.model if trainer else None),
        loader_name=cfg.loader.name,
        host_only=cfg.host_only,
        stage_times=cfg.stage_times,
        in_flight=cfg.n_workers * cfg.loader.prefetch_factor,
    )
    per_epoch: list[dict[str, float]] = []
    n_measured = cfg.repeat * cfg.epochs
    for step in range(n_measured):
        epoch_ctx = replace(ctx, epoch=step)  # reshuffles, identically on every rank
        if job.world.local_rank == 0:
            prepare_cache(cfg.cache, files)  # one page cache per machine: one rank prepares it
        barrier(job.world)
        cache_metrics = _cache_state(files)
        settings = replace(settings, description=f"epoch {step + 1}/{n_measured}")
        result = run_epoch(lambda c=epoch_ctx: loader.build(c), trainer, settings)
        epoch_metrics = {**result.metrics(), **cache_metrics}
        if job.world.distributed:
            epoch_metrics = _merge_ranks(job.world, epoch_metrics, result.ids)
        tracker.log_metrics(epoch_metrics, step=step)
        per_epoch.append(epoch_metrics)
        if job.world.is_main:
            _log_epoch(step, epoch_metrics)
        if not cfg.max_batches and not loader.synthetic:
            check_exactly_once(cfg, loader, len(ctx.records), epoch_metrics)
    return per_epoch


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _merge_ranks(
    world: World, metrics: dict[str, float], ids: np.ndarray | None
) -> dict[str, float]:
    """Whole-job metrics from every rank's, and samples_unique over the union of their ids."""
    per_rank = gather(world, metrics)
    merged = whole_job(per_rank)
    merged["world_size"] = float(world.world_size)
    all_ids = gather(world, ids)
    if all(part is not None for part in all_ids):
        merged["samples_unique"] = float(len(np.unique(np.concatenate(all_ids))))
    return merged


def summarise(per_epoch: list[dict[str, float]]) -> dict[str, float]:
    """Median, min and max of the headline metrics over every measured epoch."""
    summary: dict[str, float] = {}
    for name in HEADLINE:
        values = [epoch[name] for epoch in per_epoch if name in epoch]
        if values:
            summary[f"{name}_median"] = statistics.median(values)
            summary[f"{name}_min"] = min(values)
            summary[f"{name}_max"] = max(values)
    summary["measured_epochs"] = float(len(per_epoch))
    return summary


def _cache_state(files: list[str]) -> dict[str, float]:
    if not files:
        return {}
    rng = np.random.default_rng(0)
    sample = (
        files
        if len(files) <= _RESIDENCY_SAMPLE
        else list(rng.choice(files, _RESIDENCY_SAMPLE, replace=False))
    )
    return {"cache_resident_frac": resident_fraction(sample)}


def _log_epoch(step: int, metrics: dict[str, float]) -> None:
    extra = ""
    if "gpu_busy_frac" in metrics:
        extra = f", GPU busy {100 * metrics['gpu_busy_frac']:.0f}% of the epoch"
    if "gpu_util_mean" in metrics:
        extra += f" (NVML utilization {metrics['gpu_util_mean']:.0f}%)"
    if "steady_images_per_s" in metrics:
        steady = f"steady {metrics['steady_images_per_s']:,.1f}"
    else:
        after = int(metrics["batches"] - metrics["warmup_batches"])
        steady = f"no steady rate: {after} batch(es) after the warm-up, {MIN_STEADY_BATCHES} needed"
    log.info(
        "epoch %d: %d images in %.1f s = %.1f images/s (%s); first batch after %.2f s; "
        "waited for data %.0f%% of the time; CPU %.0f%%%s",
        step,
        metrics["samples_seen"],
        metrics["epoch_time_s"],
        metrics["images_per_s"],
        steady,
        metrics["time_to_first_batch_s"],
        100 * metrics["data_wait_frac"],
        metrics.get("cpu_util_mean", float("nan")),
        extra,
    )
    breakdown = stages.describe(metrics)
    if breakdown:
        log.info("epoch %d %s", step, breakdown)
