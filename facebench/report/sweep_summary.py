"""The end of a sweep (`train.py -m`): one table of its runs and one URL, after the last job.

A Hydra callback: each job wrote its results.json into the sweep's folder (<sweep dir>/<job>/);
this reads them back in job order, so the table holds failed and stopped jobs too. A failed job
does not stop the sweep (facebench.run.entry): the summary says which failed, which finished but are
not in MLflow (and the command that puts them there), and ends the sweep with an exit status:
1 if any job failed or recorded nothing, else 3 if any run is not in MLflow, else 0.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from facebench.errors import TrackingLost
from facebench.report import hosts_fed
from facebench.report.tables import aligned
from facebench.results import TRACKING_LOST
from facebench.tracking.tracker import UPLOAD_COMMAND

log = logging.getLogger("facebench")

HEADER = ("run", "data", "loader", "workers", "images/s", "data wait", "status")
# With emulated accelerators: their AU, and the rate that AU is a share of. AU leaves each
# accelerator's first step out (its wait is the workers' start-up) where images/s is the whole
# epoch, start-up included, so the two disagree most on short epochs; "AU images/s" puts a rate
# beside AU that it follows (AU x accelerators x each one's images/s).
AU_HEADER = ("AU", "AU images/s")
AU_LEGEND = (
    "images/s: the whole epoch, start-up included. AU: the accelerators' computing time over the\n"
    "time after their first step; AU images/s: the rate they trained at in that time (AU x their\n"
    "number x each one's images/s)"
)


def _job_number(path: Path) -> tuple[int, str]:
    folder = path.parent.name
    return (int(folder), folder) if folder.isdigit() else (1 << 30, folder)


def sweep_results(folder: Path) -> list[dict[str, Any]]:
    """Every job's results.json in a sweep folder, in job order (unreadable ones left out)."""
    found = []
    for path in sorted(folder.glob("*/results.json"), key=_job_number):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            log.warning("%s: not read (%s)", path, error)
    return found


def au_images_per_s(results: dict[str, Any]) -> float | None:
    """The rate a run's accelerators trained at over the time its AU counts (after each one's
    first step): AU x accelerators x each one's rate; None where the run emulated none."""
    params, metrics = results.get("params", {}), results.get("metrics", {})
    au, rate = metrics.get("au"), params.get("accelerator_images_per_s")
    if au is None or not rate:
        return None
    return float(au) * int(params.get("accelerators_per_host", 1)) * float(rate)


def _row(results: dict[str, Any], with_au: bool = False, with_cost: bool = False) -> list[str]:
    params, metrics = results.get("params", {}), results.get("metrics", {})
    rate, wait, au = metrics.get("images_per_s"), metrics.get("data_wait_frac"), metrics.get("au")
    fed = au_images_per_s(results)
    emulated = (
        [f"{100 * au:.0f}%" if au is not None else "-", f"{fed:,.0f}" if fed is not None else "-"]
        if with_au
        else []
    )
    client = results.get("tags", {}).get("storage_client")
    usd = metrics.get("cost_epoch_usd")
    return [
        str(results.get("run_name", "?")),
        str(results.get("tags", {}).get("data_set", params.get("data", "?"))),
        str(params.get("loader", "?")) + (f" ({client})" if client else ""),
        str(params.get("n_workers", "?")),
        f"{rate:,.1f}" if rate is not None else "-",
        f"{100 * wait:.0f}%" if wait is not None else "-",
        *emulated,
        *([f"{usd:,.4g}" if usd is not None else "-"] if with_cost else []),
        str(results.get("status", "?"))
        + (", not in MLflow" if results.get("tracking") == TRACKING_LOST else ""),
    ]


def summary_table(runs: list[dict[str, Any]]) -> str:
    """The runs as an aligned plain-text table, one line each (the loader with its S3 client,
    where it read a bucket); where a run emulated accelerators, its AU and the rate AU follows,
    and a line under the table that says which span each rate covers; where a run was priced,
    its epoch's bill (cost_epoch_usd)."""
    with_au = any("au" in results.get("metrics", {}) for results in runs)
    with_cost = any("cost_epoch_usd" in results.get("metrics", {}) for results in runs)
    header = (
        *HEADER[:6], *(AU_HEADER if with_au else ()), *(("$ an epoch",) if with_cost else ()),
        HEADER[6],
    )  # fmt: skip
    rows = (_row(results, with_au, with_cost) for results in runs)
    table = aligned(header, rows, right=set(range(4, len(header) - 1)))
    return f"{table}\n{AU_LEGEND}" if with_au else table


class SweepSummary(Callback):
    """Logs the sweep's table and where to compare its runs, once, when the sweep ends; then
    ends the sweep with its exit status (see the module's docstring)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if int(os.environ.get("RANK", "0")) != 0:
            return  # under torchrun, every rank runs the sweep; rank 0 alone records it
        folder = Path(config.hydra.sweep.dir)
        runs = sweep_results(folder)
        jobs = [job for job in folder.glob("*") if job.is_dir() and job.name.isdigit()]
        if runs:
            log.info("the sweep's %d runs:\n%s", len(runs), summary_table(runs))
            for line in hosts_fed.lines(r for r in runs if r.get("status") == "FINISHED"):
                log.info("%s", line)
        silent = len(jobs) - len(runs)
        if silent > 0:  # failed before their run began: their logs say why
            log.warning(
                "%d of the sweep's %d jobs recorded no results; see their logs in %s/<job>/",
                silent,
                len(jobs),
                folder,
            )
        untracked = sum(1 for r in runs if r.get("tracking") == TRACKING_LOST)
        if runs:
            _where_to_look(runs, folder)
        if untracked:
            log.error(
                "%d of the sweep's runs finished but are not in MLflow (it failed during them); "
                "once it answers: %s %s",
                untracked,
                UPLOAD_COMMAND,
                folder,
            )
        failed = silent + sum(1 for r in runs if r.get("status") != "FINISHED")
        if failed or untracked:
            sys.exit(1 if failed else TrackingLost.exit_code)


def _where_to_look(runs: list[dict[str, Any]], folder: Path) -> None:
    url = next((r["compare_url"] for r in reversed(runs) if r.get("compare_url")), None)
    if url:
        log.info("side by side in MLflow: %s", url)
        command = next((r["ui_command"] for r in runs if r.get("ui_command")), "")
        if command:
            log.info("(start the UI first: %s)", command)
    log.info("each run's output: %s/<job>/", folder)
