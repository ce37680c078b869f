"""Turn a sweep's MLflow runs into the article's table and a chart.

    python -m facebench.report                  # the latest sweep
    python -m facebench.report --sweep 1a2b3c4d5e --with-article

Reads the sweep's runs from MLflow into tables (sweep_table.py), renders them in Markdown
(markdown.py) and draws them (chart.py): rows n_workers, columns loaders, a cell's
epoch seconds and images/s (medians when the jobs were repeated) and, when the sweep ran the
compute ceiling with the same settings, the share of it. --with-article adds the article's own
numbers as a table and a panel of their own. report.md and report.png are written, and logged
as a run of the `facebench-reports` experiment.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from facebench.errors import FacebenchError
from facebench.host.paths import PROJECT_ROOT
from facebench.report import hosts_fed
from facebench.report.markdown import render, render_article, render_machines
from facebench.report.sweep_table import KIND_TAG, latest_sweep, tables
from facebench.tracking.store import EXPERIMENT, REPORTS_EXPERIMENT, check_server, tracking_uri
from facebench.tracking.tracker import Tracker

log = logging.getLogger("facebench.report")


def report(
    sweep: str | None, with_article: bool, out: Path | None, log_artifacts: bool = True
) -> str:
    """The sweep's table (and the article's), written to `out` as report.md and report.png."""
    import mlflow

    from facebench.report.chart import chart  # matplotlib, only when a report is drawn

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
    machines = render_machines([run.data.tags for run in chosen if run.info.status == "FINISHED"])
    text = f"## Sweep {sweep}\n\n{machines}" + "\n".join(render(s, t) for s, t in grouped.items())
    fed = hosts_fed.lines(
        {"params": r.data.params, "metrics": r.data.metrics, "tags": r.data.tags}
        for r in chosen
        if r.info.status == "FINISHED"
    )
    if fed:
        text += (
            "\n### Emulated accelerators one host feeds\n\n"
            + "\n".join(f"- {line}" for line in fed)
            + "\n"
        )
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
