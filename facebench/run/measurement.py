"""The measured epochs of one job: each built, timed, merged over ranks, checked and logged as
it ends, and their summary (median, min and max of the headline numbers).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import replace

import numpy as np

from facebench import stages
from facebench.config import TrainConfig
from facebench.host.distributed import StepBarrier, World, barrier, gather, join, whole_job
from facebench.host.pagecache import resident_fraction, set_page_cache
from facebench.loaders.shared import LoaderContext
from facebench.loaders.spec import LoaderSpec
from facebench.measure.exactly_once import check_exactly_once
from facebench.measure.meter import MIN_STEADY_BATCHES, batches_for_steady
from facebench.run.epoch import EpochResult, EpochSettings, run_epoch
from facebench.run.job import Job
from facebench.run.training import Trainer
from facebench.tracking.tracker import Tracker

log = logging.getLogger(__name__)

# Metrics summarised over all measured epochs of a job (repeat x epochs) as _median, _min, _max.
HEADLINE = (
    "epoch_time_s",
    "images_per_s",
    "steady_images_per_s",
    "time_to_first_batch_s",
    "data_wait_frac",
    "au",
)
# Steps per emulated accelerator below which its AU is a few batches' luck, and said to be.
FEW_STEPS = 10
_RESIDENCY_SAMPLE = 2000  # files checked with mincore to report the cache state


def measure(
    cfg: TrainConfig,
    job: Job,
    loader: LoaderSpec,
    ctx: LoaderContext,
    trainer: Trainer | None,
    tracker: Tracker,
    epochs: list[dict[str, float]],
) -> list[dict[str, float]]:
    """Every measured epoch (repeat x epochs), each checked and logged as it ends and added to
    `epochs` (so that a job that fails later keeps the epochs it measured); `epochs`."""
    files = loader.data_files(ctx)
    labels = [record.label for record in ctx.records]
    settings = EpochSettings(
        device=job.device,
        geometry=ctx.geometry,
        max_batches=cfg.max_batches,
        sample_hz=cfg.sample_hz,
        label_counts=np.bincount(labels, minlength=ctx.labels.n_classes),
        expected_images=_expected(ctx) if not cfg.max_batches else None,
        join=join(trainer.model if trainer else None),
        loader_name=cfg.loader.name,
        # An emulated accelerator takes batches as a GPU run's host side hands them over.
        host_only=cfg.host_only or job.accelerator is not None,
        stage_times=cfg.stage_times,
        in_flight=cfg.n_workers * cfg.loader.prefetch_factor,
        accelerator=job.accelerator,
    )
    emulated_ranks = job.accelerator is not None and job.world.distributed
    steps_met = StepBarrier(job.device) if emulated_ranks else None
    n_measured = cfg.repeat * cfg.epochs
    for step in range(n_measured):
        epoch_ctx = replace(ctx, epoch=step)  # reshuffles, identically on every rank
        if job.world.local_rank == 0:
            set_page_cache(cfg.cache, files)  # one page cache per machine: one rank prepares it
        barrier(job.world)
        cache_metrics = _cache_state(files)
        settings = replace(settings, description=f"epoch {step + 1}/{n_measured}")
        if steps_met is not None:  # a Join of its own each epoch, as DDP's model.join() gives
            settings = replace(settings, barrier=steps_met, join=steps_met.join())
        result = run_epoch(lambda c=epoch_ctx: loader.build(c), trainer, settings)
        epoch_metrics = {**result.metrics(), **cache_metrics}
        if job.world.distributed:
            epoch_metrics = _merge_ranks(job.world, epoch_metrics, result)
            if job.accelerator is not None and "au" in epoch_metrics:
                epoch_metrics["au_pass"] = float(epoch_metrics["au"] >= job.accelerator.min_au)
        tracker.log_metrics(epoch_metrics, step=step)
        epochs.append(epoch_metrics)
        if job.world.is_main:
            _log_epoch(step, epoch_metrics, settings.in_flight)
        if not cfg.max_batches and not loader.ceiling and loader.own is None:
            check_exactly_once(cfg, loader, len(ctx.records), epoch_metrics)
    return epochs


def _expected(ctx: LoaderContext) -> int | None:
    """The samples an epoch holds, for its progress bar: the records', or a user's dataset's
    len() (None where it has none)."""
    return len(ctx.records) if ctx.own is None else ctx.own.built.length()


def _merge_ranks(world: World, metrics: dict[str, float], result: EpochResult) -> dict[str, float]:
    """Whole-job metrics from every rank's (their GETs pooled), and samples_unique over the
    union of their ids."""
    merged = whole_job(gather(world, metrics), gather(world, result.fetches))
    merged["world_size"] = float(world.world_size)
    all_ids = gather(world, result.ids)
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


def _log_epoch(step: int, metrics: dict[str, float], in_flight: int = 0) -> None:
    extra = ""
    if "gpu_busy_frac" in metrics:
        extra = f", GPU busy {100 * metrics['gpu_busy_frac']:.0f}% of the epoch"
    if "gpu_util_mean" in metrics:
        extra += f" (NVML utilization {metrics['gpu_util_mean']:.0f}%)"
    if "au" in metrics:
        lowest = f", lowest {metrics['au_min']:.0%}" if "au_min" in metrics else ""
        verdict = "fed" if metrics.get("au_pass") else "not fed"
        extra += f"; emulated accelerator busy {metrics['au']:.0%} (AU{lowest}): {verdict}"
        steps = int(metrics.get("accelerator_steps", FEW_STEPS))
        if steps < FEW_STEPS:
            log.warning(
                "AU of %d step(s) (the first left out): one late batch moves it; give each "
                "accelerator %d or more with a smaller batch_size or more images",
                steps,
                FEW_STEPS,
            )
    # A short epoch has no steady rate: the default run's 10 batches are all made at once by 5
    # workers, 2 ahead each, so every one of them is start-up, and its whole-epoch rate is the
    # honest one. Saying so at INFO on every such run would flag the default run as a fault;
    # docs/metrics.md says when a steady rate is absent, and DEBUG why.
    if "steady_images_per_s" in metrics:
        steady = f" (steady {metrics['steady_images_per_s']:,.1f})"
    else:
        steady = ""
        log.debug(
            "epoch %d: no steady rate: %d of its %d batches were warm-up (a tenth of the epoch, "
            "and at least the %d that n_workers x prefetch_factor start on at once), and a "
            "steady rate needs %d after the warm-up: %d batches or more (a larger "
            "data.n_images or a smaller batch_size)",
            step,
            metrics["warmup_batches"],
            metrics["batches"],
            in_flight,
            MIN_STEADY_BATCHES,
            batches_for_steady(in_flight),
        )
    log.info(
        "epoch %d: %d images in %.1f s = %.1f images/s%s; first batch after %.2f s; "
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
