"""Turn a sweep's MLflow runs into the article's table and a chart.

    python -m facebench.report                  # the latest sweep
    python -m facebench.report --sweep 1a2b3c4d5e --with-seed

Rows are n_workers, columns loaders; a cell holds epoch seconds and images/s (medians when the
jobs were repeated) and, when the sweep ran loader=synthetic with the same settings, the share of
that compute ceiling. Runs whose settings differ in anything but the loader and n_workers (model,
batch size, cache, data, ...) go into separate tables. The table (Markdown) and the chart (PNG)
are printed/written and logged as artifacts of a `report-<sweep id>` run.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from facebench.paths import PROJECT_ROOT
from facebench.tracking import EXPERIMENT, check_server, tracking_uri

log = logging.getLogger("facebench.report")

# The article's table: one epoch of 922,599 images, batch 600, RTX 2080 Ti, i9-9900K.
SEED_SECONDS = {
    10: {"dataset": 3581, "datapipe": 7986, "pickle": 758},
    5: {"dataset": 10034, "datapipe": 2993, "pickle": 760},
}
SEED_IMAGES = 922_599
CEILING = "synthetic"
SEED_LOADERS = ("dataset", "datapipe", "pickle")  # columns come first, in the article's order
# What must match for runs to share a table; loader and n_workers vary within one.
GROUP_PARAMS = (
    "data",
    "data.root",
    "data.n_images",
    "model",
    "amp",
    "batch_size",
    "cache",
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


def _metric(run, name: str) -> float:
    metrics = run.data.metrics
    return metrics.get(f"{name}_median", metrics.get(name, math.nan))


def latest_sweep(runs) -> str | None:
    for run in sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True):
        if run.data.tags.get(KIND_TAG) != "report" and "sweep_id" in run.data.tags:
            return run.data.tags["sweep_id"]
    return None


def tables(runs) -> dict[tuple, dict[int, dict[str, Cell]]]:
    """{settings: {n_workers: {loader column: cell}}} over the finished runs."""
    grouped: dict[tuple, dict[int, dict[str, Cell]]] = defaultdict(lambda: defaultdict(dict))
    runs = [
        run
        for run in runs
        if run.info.status == "FINISHED" and run.data.tags.get(KIND_TAG) != "report"
    ]
    varying = _varying_loader_options(runs)
    for run in runs:
        params = run.data.params
        key = tuple((name, params.get(name, "")) for name in GROUP_PARAMS)
        cell = Cell(
            epoch_s=_metric(run, "epoch_time_s"),
            images_per_s=_metric(run, "images_per_s"),
            repeats=int(run.data.metrics.get("measured_epochs", 1)),
        )
        column = _column(params, varying.get(params["loader"], ()))
        row = grouped[key][int(params["n_workers"])]
        if column in row:
            raise SystemExit(
                f"runs {run.info.run_name} and another share settings {dict(key)}, "
                f"n_workers={params['n_workers']} and loader column {column!r}; they cannot "
                "share one cell. Report them as separate sweeps (--sweep)"
            )
        row[column] = cell
    return grouped


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


def _ordered(loaders: set[str]) -> list[str]:
    seed = [
        column
        for name in SEED_LOADERS
        for column in sorted(loaders)
        if column.split(" (")[0] == name
    ]
    return seed + sorted(loaders - set(seed))


def render(settings: tuple, table: dict[int, dict[str, Cell]], with_seed: bool) -> str:
    loaders = _ordered({loader for row in table.values() for loader in row if loader != CEILING})
    ceilings = [row[CEILING].images_per_s for row in table.values() if CEILING in row]
    ceiling = max(ceilings) if ceilings else None
    title = ", ".join(f"{name}={value}" for name, value in settings if value != "")
    lines = [f"### {title}", ""]
    header = ["n workers", *loaders]
    if with_seed:
        header += [f"article {loader}, s" for loader in SEED_LOADERS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workers in sorted(table, reverse=True):
        row = [str(workers)]
        for loader in loaders:
            cell = table[workers].get(loader)
            if cell is None:
                row.append("")
                continue
            text = f"{cell.epoch_s:.1f} s, {cell.images_per_s:,.0f} img/s"
            if ceiling:
                text += f", {100 * cell.images_per_s / ceiling:.0f}% of ceiling"
            row.append(text)
        if with_seed:
            seed = SEED_SECONDS.get(workers, {})
            row += [
                f"{seed[name]:,}" if name in seed else ""
                for name in ("dataset", "datapipe", "pickle")
            ]
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    if ceiling:
        notes.append(f"Compute ceiling (loader=synthetic): {ceiling:,.0f} img/s.")
    repeats = {cell.repeats for row in table.values() for cell in row.values()}
    if max(repeats, default=1) > 1:
        notes.append("Cells are medians over each job's measured epochs.")
    if with_seed:
        notes.append(
            f"Article: one epoch of {SEED_IMAGES:,} images, batch 600, RTX 2080 Ti; seconds only."
        )
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def chart(grouped: dict[tuple, dict[int, dict[str, Cell]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(grouped), 1, figsize=(8, 3.5 * len(grouped)), squeeze=False)
    for axis, (settings, table) in zip(axes[:, 0], grouped.items(), strict=True):
        loaders = _ordered({loader for row in table.values() for loader in row})
        workers = sorted(table)
        width = 0.8 / max(len(loaders), 1)
        for offset, loader in enumerate(loaders):
            values = [table[w][loader].images_per_s if loader in table[w] else 0 for w in workers]
            positions = [i + offset * width for i in range(len(workers))]
            axis.bar(positions, values, width, label=loader)
        axis.set_xticks([i + width * (len(loaders) - 1) / 2 for i in range(len(workers))])
        axis.set_xticklabels([f"{w} workers" for w in workers])
        axis.set_ylabel("images/s")
        axis.set_title(", ".join(f"{k}={v}" for k, v in settings if v != ""), fontsize=8)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def report(sweep: str | None, with_seed: bool, out: Path | None, log_artifacts: bool = True) -> str:
    import mlflow

    check_server(tracking_uri())
    mlflow.set_tracking_uri(tracking_uri())
    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    if not runs:
        raise SystemExit(f"no runs in experiment {EXPERIMENT!r} at {tracking_uri()}")
    sweep = sweep or latest_sweep(runs)
    chosen = [run for run in runs if run.data.tags.get("sweep_id") == sweep]
    grouped = tables(chosen)
    if not grouped:
        raise SystemExit(f"sweep {sweep}: no finished runs at {tracking_uri()}")
    text = f"## Sweep {sweep}\n\n" + "\n".join(
        render(settings, table, with_seed) for settings, table in grouped.items()
    )
    out = out or PROJECT_ROOT / "outputs" / "reports" / sweep
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text, encoding="utf-8")
    chart(grouped, out / "report.png")
    if log_artifacts:
        with mlflow.start_run(
            experiment_id=chosen[0].info.experiment_id,
            run_name=f"report-{sweep}",
            tags={"sweep_id": sweep, KIND_TAG: "report"},
        ):
            mlflow.log_artifact(str(out / "report.md"))
            mlflow.log_artifact(str(out / "report.png"))
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m facebench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sweep", help="sweep_id tag of the runs (default: the latest sweep)")
    parser.add_argument("--with-seed", action="store_true", help="add the article's numbers")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for report.md and report.png (default: outputs/reports/<sweep id>)",
    )
    parser.add_argument("--no-log", action="store_true", help="do not log a report run to MLflow")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    text = report(args.sweep, args.with_seed, args.out, log_artifacts=not args.no_log)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
