"""The measured epochs of one job: each built, timed, merged over ranks, checked and logged as
it ends, and their summary (median, min and max of the headline numbers).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from facebench.config import TrainConfig
from facebench.host.distributed import StepBarrier, World, barrier, gather, join, whole_job
from facebench.host.pagecache import resident_fraction, set_page_cache
from facebench.loaders.shared import LoaderContext
from facebench.loaders.spec import LoaderSpec
from facebench.measure.epoch_lines import log_epoch
from facebench.measure.exactly_once import check_exactly_once
from facebench.run.epoch import EpochResult, EpochSettings, run_epoch
from facebench.run.job import Job
from facebench.run.training import Trainer
from facebench.tracking.tracker import Tracker

log = logging.getLogger(__name__)

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
            log_epoch(step, epoch_metrics, settings.in_flight)
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
