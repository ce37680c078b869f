"""What a Ray Data epoch measures (facebench/loaders/raydata.py): the stage times that travel in
each batch's first row, from the Ray task that made it, and Ray's own per-operator statistics."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from facebench.fetches import BUCKETS, Fetches
from facebench.stages import WORKER_STAGES, StageTimes

log = logging.getLogger(__name__)

_N = len(WORKER_STAGES)
# A batch's stage times, as one row of int64: wall ns, CPU ns per stage, the producer's CPU
# ns, its pid and thread, the PIL fallbacks.
_STAGE_COLUMNS = 2 * _N + 4


def stage_rows(times: StageTimes | None, n: int) -> np.ndarray:
    """A batch's stage times as an (n, columns) int64 array: the first row holds them (a column
    needs a value per row)."""
    rows = np.zeros((n, _STAGE_COLUMNS), dtype=np.int64)
    if times is not None and n:
        rows[0] = [*times.ns, *times.stage_cpu_ns, times.cpu_ns, *times.producer, times.fallbacks]
    return rows


def stage_times(rows: torch.Tensor) -> StageTimes | None:
    """The stage times `stage_rows` put in the batch's first row; None where none were taken."""
    first = rows[0].tolist() if len(rows) else []
    if not any(first):
        return None
    return StageTimes(
        tuple(first[:_N]),
        tuple(first[_N : 2 * _N]),
        first[2 * _N],
        (first[2 * _N + 1], first[2 * _N + 2]),
        first[2 * _N + 3],
    )


# A batch's GETs from a bucket (facebench/fetches.py), as one row of int64: requests, bytes,
# retries, 503s, the latencies' and first bytes' sums (ns: an int64 holds 292 years of them),
# then the latency and first-byte histograms. A column of its own, present only where the data
# come from a bucket.
_FETCH_HEAD = 6
_FETCH_COLUMNS = _FETCH_HEAD + 2 * BUCKETS


def fetch_rows(fetches: Fetches, n: int) -> np.ndarray:
    """A batch's GETs as an (n, columns) int64 array, in its first row."""
    rows = np.zeros((n, _FETCH_COLUMNS), dtype=np.int64)
    if n:
        head = [fetches.requests, fetches.bytes, fetches.retries, fetches.throttled]
        sums = [fetches.latency_ns, fetches.first_byte_ns]
        rows[0] = [*head, *sums, *fetches.latency, *fetches.first_byte]
    return rows


def fetches_of(rows: torch.Tensor) -> Fetches | None:
    """The GETs `fetch_rows` put in the batch's first row; None where there were none."""
    first = rows[0].tolist() if len(rows) else []
    if not first or not first[0]:
        return None
    histograms = first[_FETCH_HEAD:]
    return Fetches(
        requests=first[0],
        bytes=first[1],
        retries=first[2],
        throttled=first[3],
        latency_ns=first[4],
        first_byte_ns=first[5],
        latency=histograms[:BUCKETS],
        first_byte=histograms[BUCKETS:],
    )


def ray_metrics(summary: Any) -> dict[str, float]:
    """From Ray Data's DatasetStatsSummary: the decode operator's tasks, the nodes they ran on,
    their CPU and wall time, and the loop's time blocked on Ray's iterator."""
    metrics: dict[str, float] = {}
    for op in summary.operators_stats:
        if "LoadBatch" not in op.operator_name:
            continue
        if op.node_count is not None:
            metrics["ray_tasks"] = float(op.node_count.sum)
            metrics["ray_nodes_used"] = float(op.node_count.count)
            metrics["ray_tasks_per_node_min"] = float(op.node_count.min)
            metrics["ray_tasks_per_node_max"] = float(op.node_count.max)
        if op.cpu_time is not None:
            metrics["ray_task_cpu_s"] = float(op.cpu_time.sum)
        if op.wall_time is not None:
            metrics["ray_task_wall_s"] = float(op.wall_time.sum)
    blocked = getattr(summary.iter_stats, "block_time", None)
    if blocked is not None and getattr(blocked, "get", None):
        metrics["ray_iter_blocked_s"] = float(blocked.get())
    if "ray_tasks" in metrics:
        log.info(
            "raydata: Ray ran %d decode tasks on %d node(s) (%d-%d a node), %.1f s of CPU "
            "(read, decode, transform and collate, and Ray's block building: not broken down)",
            metrics["ray_tasks"],
            metrics["ray_nodes_used"],
            metrics["ray_tasks_per_node_min"],
            metrics["ray_tasks_per_node_max"],
            metrics.get("ray_task_cpu_s", 0.0),
        )
    return metrics
