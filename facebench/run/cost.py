"""What a run's epoch cost, said at its end (rank 0, once): the requests, bytes and
accelerator-hours it measured, at the prices of conf/cost/ (facebench/costs.py).

    say_cost(cfg, ranks, metrics, tracker)

An epoch of cost.epoch_images (the user's own set; 0: the run's epoch) scales the requests and
hours from the measured epoch, and the line says it did.
"""

from __future__ import annotations

import logging

from facebench.config import TrainConfig
from facebench.costs import EpochCost, Prices
from facebench.tracking.tracker import Tracker

log = logging.getLogger(__name__)


def say_cost(
    cfg: TrainConfig, ranks: int, metrics: dict[str, float], tracker: Tracker
) -> EpochCost | None:
    """Log and record one epoch's bill (its metrics gain cost_*), where the run measured one."""
    prices = Prices.of(cfg.cost, cfg.storage.name, cfg.accelerator.name)
    # Every rank feeds one accelerator, emulated or real: the job's rate is all of theirs.
    cost = EpochCost.of(prices, metrics, ranks, cfg.cost.epoch_images)
    if cost is None:
        return None
    found = cost.metrics()
    metrics.update(found)
    tracker.log_metrics(found)
    if cfg.storage.name != "local" or prices.gpu_per_hour is not None:
        log.info("cost: %s", cost.said())
    return cost
