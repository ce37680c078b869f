"""What an epoch's metrics say: its lines in the log (train.py's and watch's alike), and the
summaries over a job's epochs (median, min and max of the headline numbers)."""

from __future__ import annotations

import logging
import statistics

from facebench import stages
from facebench.measure.meter import MIN_STEADY_BATCHES, batches_for_steady

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


def log_epoch(step: int, metrics: dict[str, float], in_flight: int = 0) -> None:
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
