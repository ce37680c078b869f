"""Turn a sweep's MLflow runs into the article's table and a chart.

    python -m facebench.report                  # the latest sweep
    python -m facebench.report --sweep 1a2b3c4d5e --with-article

Rows are n_workers (ascending), columns loaders; a cell holds epoch seconds and images/s (medians
when the jobs were repeated) and, when the sweep ran loader=synthetic with the same settings, the
share of that compute ceiling. Runs whose settings differ in anything but the loader and n_workers
(model, batch size, cache, data, host_only, ...) go into separate tables. --with-article adds the
article's own numbers as a table and a panel of their own. The table (Markdown) and the chart
(PNG) are printed or written, and logged as a run of the `facebench-reports` experiment.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from facebench.errors import FacebenchError
from facebench.paths import PROJECT_ROOT
from facebench.stages import WORKER_STAGES
from facebench.tracking import EXPERIMENT, REPORTS_EXPERIMENT, Tracker, tracking_uri
from facebench.tracking_store import check_server

log = logging.getLogger("facebench.report")

# The article's table: one epoch of 922,599 images, batch 600, RTX 2080 Ti, i9-9900K.
ARTICLE_SECONDS = {
    5: {"dataset": 10034, "datapipe": 2993, "pickle": 760},
    10: {"dataset": 3581, "datapipe": 7986, "pickle": 758},
}
ARTICLE_IMAGES = 922_599
CEILING = "synthetic"
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
    """For each loader, the loader.* options that differ between its runs (a sweep over
    loader.decoder, say): they become part of the column's name."""
    values: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for run in runs:
        params = run.data.params
        for name, value in params.items():
            if name.startswith("loader.") and name != "loader.name":
                values[params.get("loader", "")][name].add(value)
    return {
        loader: tuple(sorted(name for name, seen in options.items() if len(seen) > 1))
        for loader, options in values.items()
    }


def _column(params: dict[str, str], options: tuple[str, ...]) -> str:
    if not options:
        return params["loader"]
    detail = ", ".join(f"{name.removeprefix('loader.')}={params.get(name)}" for name in options)
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
    # The size asked for: shards may be cut smaller, and the table's note gives the size used.
    return name != "shard_size"


def title(settings: Settings) -> str:
    """The settings a table's runs share, those that apply to them only."""
    given = dict(settings)
    return ", ".join(f"{name}={value}" for name, value in settings if _applies(name, value, given))


def render(settings: Settings, table: Table) -> str:
    """One settings group as a Markdown table: rows n_workers, columns loaders."""
    loaders = ordered({loader for row in table.values() for loader in row if loader != CEILING})
    ceiling = ceiling_of(table)
    lines = [f"### {title(settings)}", ""]
    header = ["n workers", *loaders]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workers in sorted(table):
        row = [str(workers)]
        for loader in loaders:
            cell = table[workers].get(loader)
            if cell is None:
                row.append("not run")
                continue
            text = f"{cell.epoch_s:,.1f} s, {cell.images_per_s:,.0f} img/s"
            if ceiling:
                text += f", {100 * cell.images_per_s / ceiling:.0f}% of ceiling"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    if ceiling:
        notes.append(f"Compute ceiling (loader=synthetic): {ceiling:,.0f} img/s.")
    shards = [
        f"{loader} with {workers} workers: {cell.shard_size_used:,}"
        for workers in sorted(table)
        for loader, cell in table[workers].items()
        if cell.shard_size_used is not None
    ]
    if shards:
        notes.append("Samples per shard (`shard_size_used`): " + "; ".join(shards) + ".")
    repeats = {cell.repeats for row in table.values() for cell in row.values()}
    if max(repeats, default=1) > 1:
        notes.append("Cells are medians over each job's measured epochs.")
    return "\n".join(lines + ([""] + notes if notes else []) + _render_stages(table)) + "\n"


def _render_stages(table: Table) -> list[str]:
    """Where each image's time went in the workers, per loader and n_workers."""
    rows = [
        (loader, workers, cell)
        for workers in sorted(table)
        for loader in ordered(set(table[workers]))
        if (cell := table[workers][loader]).stages
    ]
    if not rows:
        return []
    lines = [
        "",
        "Where each image's time went: the workers' CPU time per image in each stage, in "
        "microseconds summed over the workers (each run's last epoch; the costliest stage in "
        "bold), and the time they waited inside the stages for a core or storage:",
        "",
        "| loader | n workers | " + " | ".join(WORKER_STAGES) + " | waited |",
        "|" + "---|" * (len(WORKER_STAGES) + 3),
    ]
    for loader, workers, cell in rows:
        top = max(cell.stages, key=cell.stages.__getitem__)
        values = [
            (f"**{us:,.0f}**" if name == top else f"{us:,.0f}")
            for name, us in ((name, cell.stages.get(name, 0.0)) for name in WORKER_STAGES)
        ]
        waited = f"{cell.waited_us:,.0f}" if cell.waited_us is not None else "-"
        lines.append(f"| {loader} | {workers} | " + " | ".join([*values, waited]) + " |")
    return lines


def render_article() -> str:
    """The article's own numbers, as a table of their own."""
    lines = [
        "### The article: one epoch of 922,599 images, batch 600, RTX 2080 Ti, i9-9900K",
        "",
        "| n workers | " + " | ".join(ARTICLE_LOADERS) + " |",
        "|" + "---|" * (len(ARTICLE_LOADERS) + 1),
    ]
    for workers in sorted(ARTICLE_SECONDS):
        cells = [
            f"{seconds:,} s, {ARTICLE_IMAGES / seconds:,.0f} img/s"
            for seconds in (ARTICLE_SECONDS[workers][name] for name in ARTICLE_LOADERS)
        ]
        lines.append(f"| {workers} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def article_table() -> Table:
    return {
        workers: {
            name: Cell(seconds, ARTICLE_IMAGES / seconds, 1) for name, seconds in loaders.items()
        }
        for workers, loaders in ARTICLE_SECONDS.items()
    }


def report(
    sweep: str | None, with_article: bool, out: Path | None, log_artifacts: bool = True
) -> str:
    """The sweep's table (and the article's), written to `out` as report.md and report.png."""
    import mlflow

    from facebench.report_chart import chart  # matplotlib, only when a report is drawn

    check_server(tracking_uri())
    mlflow.set_tracking_uri(tracking_uri())
    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    if not runs:
        raise FacebenchError(f"no runs in experiment {EXPERIMENT!r} at {tracking_uri()}")
    sweep = sweep or latest_sweep(runs)
    chosen = [run for run in runs if run.data.tags.get("sweep_id") == sweep]
    grouped = tables(chosen)
    if not grouped:
        raise FacebenchError(f"sweep {sweep}: no finished runs at {tracking_uri()}")
    text = f"## Sweep {sweep}\n\n" + "\n".join(render(s, t) for s, t in grouped.items())
    if with_article:
        text += "\n" + render_article()
    out = out or PROJECT_ROOT / "outputs" / "reports" / sweep
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text, encoding="utf-8")
    chart(grouped, out / "report.png", with_article)
    log.info("wrote %s and %s", out / "report.md", out / "report.png")
    if log_artifacts:
        tracker = Tracker(experiment=REPORTS_EXPERIMENT)
        with tracker.run(f"report-{sweep}", {"sweep_id": sweep}, {KIND_TAG: "report"}):
            tracker.log_artifact(out / "report.md")
            tracker.log_artifact(out / "report.png")
        log.info("report run logged in experiment %r", REPORTS_EXPERIMENT)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m facebench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sweep", help="sweep_id tag of the runs (default: the latest sweep)")
    parser.add_argument(
        "--with-article",
        "--with-seed",  # its name before 0.2, kept so scripts that use it still run
        dest="with_article",
        action="store_true",
        help="add the article's numbers",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for report.md and report.png (default: outputs/reports/<sweep id>)",
    )
    parser.add_argument("--no-log", action="store_true", help="do not log a report run to MLflow")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # its own lines (what it wrote), not the libraries' chatter
    try:
        text = report(args.sweep, args.with_article, args.out, log_artifacts=not args.no_log)
    except FacebenchError as error:
        raise SystemExit(str(error)) from None
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
