"""A sweep's runs as tables: the model that markdown.py renders as Markdown and chart.py
draws. Runs whose settings differ in anything but the loader and n_workers (model, batch size,
cache, data, host_only, ...) go into separate tables; rows are n_workers, columns loaders (with
the loader.* options that vary between a loader's runs), a cell a run's epoch time, rate and
where its workers' CPU time went. The article's own table is one of the same shape.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from facebench.errors import FacebenchError
from facebench.stages import WORKER_STAGES, parts

# The article's table: one epoch of 922,599 images, batch 600, RTX 2080 Ti, i9-9900K.
ARTICLE_SECONDS = {
    5: {"dataset": 10034, "datapipe": 2993, "pickle": 760},
    10: {"dataset": 3581, "datapipe": 7986, "pickle": 758},
}
ARTICLE_IMAGES = 922_599
CEILING = "ceiling"
ARTICLE_LOADERS = tuple(ARTICLE_SECONDS[5])  # its three pipelines come first, in its order
# What must match for runs to share a table; loader and n_workers vary within one.
GROUP_PARAMS = (
    "data",
    "data.root",
    "data.n_images",
    "model",
    "amp_resolved",
    "batch_size",
    "cache",
    "host_only",
    "device_type",
    "world_size",
    "epochs",
    "max_batches",
    "shard_size",
    "accelerator.name",
    "accelerators_per_host",
)
KIND_TAG = "facebench.kind"


@dataclass
class Cell:
    epoch_s: float
    images_per_s: float
    repeats: int
    # The workers' CPU time per image by stage (us, summed over workers), where the run
    # measured it (wall time, for runs made before CPU time was measured).
    stages: dict[str, float] = field(default_factory=dict)
    # Wall time per image inside the stages beyond their CPU time: waiting for a core or storage.
    waited_us: float | None = None
    # Samples per shard the run read, for loaders whose workers read shards of their own (it
    # may be below shard_size: shards are cut so that every worker has one).
    shard_size_used: int | None = None
    # An emulated accelerator's utilization, where the run emulated one.
    au: float | None = None
    # One epoch's bill in dollars (facebench/costs.py), where every price was known.
    epoch_usd: float | None = None
    # A custom loader's transforms by name, each one's share of the stages' time, costliest first.
    parts: list[tuple[str, float]] = field(default_factory=list)


Table = dict[int, dict[str, Cell]]  # n_workers -> loader column -> cell
Settings = tuple[tuple[str, str], ...]


def _metric(run, name: str) -> float:
    metrics = run.data.metrics
    return metrics.get(f"{name}_median", metrics.get(name, math.nan))


def latest_sweep(runs) -> str | None:
    for run in sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True):
        if run.data.tags.get(KIND_TAG) != "report" and "sweep_id" in run.data.tags:
            return run.data.tags["sweep_id"]
    return None


def _measured(run) -> bool:
    """Finished training runs that measured something (a ceiling without a model does not)."""
    params = run.data.params
    ceiling_without_model = params.get("loader") == CEILING and params.get("model") == "none"
    return (
        run.info.status == "FINISHED"
        and run.data.tags.get(KIND_TAG) != "report"
        and not ceiling_without_model
    )


def tables(runs) -> dict[Settings, Table]:
    """{settings: {n_workers: {loader column: cell}}} over the finished runs."""
    grouped: dict[Settings, Table] = defaultdict(lambda: defaultdict(dict))
    runs = [run for run in runs if _measured(run)]
    varying = _varying_loader_options(runs)
    for run in runs:
        params = run.data.params
        key = tuple((name, params.get(name, "")) for name in GROUP_PARAMS)
        cell = Cell(
            epoch_s=_metric(run, "epoch_time_s"),
            images_per_s=_metric(run, "images_per_s"),
            repeats=int(run.data.metrics.get("measured_epochs", 1)),
            stages=_stages(run.data.metrics),
            waited_us=run.data.metrics.get("stage_waited_us"),
            shard_size_used=_shard_size_used(run.data.metrics),
            au=run.data.metrics.get("au"),
            epoch_usd=run.data.metrics.get("cost_epoch_usd"),
            parts=parts(run.data.metrics),
        )
        column = _column(params, varying.get(params["loader"], ()))
        row = grouped[key][int(params["n_workers"])]
        if column in row:
            raise FacebenchError(
                f"runs {run.info.run_name} and another share settings {dict(key)}, "
                f"n_workers={params['n_workers']} and loader column {column!r}; they cannot "
                "share one cell. Report them as separate sweeps (--sweep)"
            )
        row[column] = cell
    return grouped


def _shard_size_used(metrics: dict[str, float]) -> int | None:
    used = metrics.get("shard_size_used")
    return int(used) if used is not None else None


def _stages(metrics: dict[str, float]) -> dict[str, float]:
    cpu = any(f"stage_{name}_cpu_us" in metrics for name in WORKER_STAGES)
    found = {
        name: metrics.get(f"stage_{name}_cpu_us" if cpu else f"stage_{name}_us")
        for name in WORKER_STAGES
    }
    return {name: us for name, us in found.items() if us is not None}


def _varying_loader_options(runs) -> dict[str, tuple[str, ...]]:
    """For each loader, the loader.* options (and the S3 client, storage.client) that differ
    between its runs (a sweep over loader.decoder, say): they become part of the column's
    name."""
    values: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for run in runs:
        params = run.data.params
        for name, value in params.items():
            if (name.startswith("loader.") and name != "loader.name") or name == "storage.client":
                values[params.get("loader", "")][name].add(value)
    return {
        loader: tuple(sorted(name for name, seen in options.items() if len(seen) > 1))
        for loader, options in values.items()
    }


def _column(params: dict[str, str], options: tuple[str, ...]) -> str:
    if not options:
        return params["loader"]
    detail = ", ".join(
        f"{name.removeprefix('loader.').removeprefix('storage.')}={params.get(name)}"
        for name in options
    )
    return f"{params['loader']} ({detail})"


def ordered(loaders: set[str]) -> list[str]:
    seed = [
        column
        for name in ARTICLE_LOADERS
        for column in sorted(loaders)
        if column.split(" (")[0] == name
    ]
    return seed + sorted(loaders - set(seed))


def ceiling_of(table: Table) -> float | None:
    ceilings = [row[CEILING].images_per_s for row in table.values() if CEILING in row]
    return max(ceilings) if ceilings else None


def _applies(name: str, value: str, given: dict[str, str]) -> bool:
    """Whether a setting says anything about these runs (amp without a model does not)."""
    if value in ("", "None"):
        return False
    if name == "amp_resolved":
        return given.get("model") != "none"
    if name == "data.n_images":
        return given.get("data") == "synthetic"
    if name == "max_batches":
        return value != "0"
    if name in ("accelerator.name", "accelerators_per_host"):
        return value not in ("none", "1")
    # The size asked for: shards may be cut smaller, and the table's note gives the size used.
    return name != "shard_size"


def title(settings: Settings) -> str:
    """The settings a table's runs share, those that apply to them only."""
    given = dict(settings)
    return ", ".join(f"{name}={value}" for name, value in settings if _applies(name, value, given))


def article_table() -> Table:
    return {
        workers: {
            name: Cell(seconds, ARTICLE_IMAGES / seconds, 1) for name, seconds in loaders.items()
        }
        for workers, loaders in ARTICLE_SECONDS.items()
    }
