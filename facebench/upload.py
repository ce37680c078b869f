"""Put runs that are not in MLflow there, from their results.json, as the runs they would have been.

    python -m facebench.upload outputs/2026-12-02/10-00-00          # one job's folder
    python -m facebench.upload multirun/2026-12-02/10-00-00         # every job of a sweep
    MLFLOW_TRACKING_URI=http://host:5000 python -m facebench.upload multirun/

A path is a job's output folder, or any folder above jobs: every results.json below it. Runs go
into the store MLFLOW_TRACKING_URI names (the project's mlflow.db by default), experiment
`facebench`, with their name, params, tags (the sweep id among them), each epoch's metrics at its
step, the job's metrics, start, end and status, and the artifacts that were kept (results.json,
the Hydra config, the class map). A run is found again by its job_id tag:

- a job whose MLflow failed mid-run completes the run MLflow had begun, where this store has it;
- a job this store has no run of (tracking=false, another store, a run never begun) becomes a
  new run, if it measured an epoch;
- a run already complete is left alone: a job that logged normally, or one uploaded before
  (tagged facebench.uploaded). Uploading a folder twice adds nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from facebench.errors import FacebenchError
from facebench.results import RESULTS, TRACKING_LOGGED, JobResults
from facebench.tracking import mlflow_views as views
from facebench.tracking import run_owner
from facebench.tracking.replay import replay
from facebench.tracking.store import (
    ALL_RUNS_VIEW,
    EXPERIMENT,
    bounded_http_retries,
    check_server,
    check_writable_store,
    ensure_experiment,
    tracking_uri,
    ui_address,
    ui_command,
)
from facebench.tracking.tracker import failure_reason

log = logging.getLogger("facebench.upload")

UPLOADED_TAG = "facebench.uploaded"


def results_files(path: Path) -> list[Path]:
    """The results.json of the job at `path`, or of every job below it, in job order."""
    if path.is_file():
        return [path]
    if (path / RESULTS).is_file():
        return [path / RESULTS]
    if not path.is_dir():
        raise FacebenchError(f"{path}: no such folder")
    found = sorted(path.rglob(RESULTS), key=_job_order)
    if not found:
        raise FacebenchError(f"{path}: holds no {RESULTS}, in it or below it")
    return found


def _job_order(path: Path) -> tuple:
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts)


def upload(client: Any, experiment_id: str, path: Path) -> str:
    """One job's run into the experiment (see the module's docstring); what was done, in a
    line."""
    results = JobResults.read(path)
    folder = path.parent
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.job_id = '{results.job_id}'", max_results=1
    )
    run = found[0] if found else None
    if run is not None and (run.data.tags.get(UPLOADED_TAG) or results.tracking == TRACKING_LOGGED):
        return f"{folder}: run {results.run_name} is already in MLflow; nothing added"
    if run is None and not results.epochs:
        return f"{folder}: run {results.run_name} measured no epoch ({results.status}); skipped"
    run_id = replay(client, experiment_id, results, folder, run)
    # Closed meanwhile, its owner gone: now complete.
    if run is not None and run_owner.ENDED_TAG in run.data.tags:
        client.delete_tag(run_id, run_owner.ENDED_TAG)
    client.set_tag(run_id, UPLOADED_TAG, "true")  # last: an upload cut short is done again
    how = "completed the run MLflow had begun" if found else "a new run"
    return f"{folder}: run {results.run_name} put into MLflow ({how}, {run_id})"


def _publish_sweep_views(client: Any, experiment_id: str, paths: list[Path]) -> list[str]:
    """The runs view of each sweep uploaded (a sweep's jobs may all have run without MLflow,
    so that no job published it); their URLs."""
    keys = []
    for path in paths:
        try:
            results = JobResults.read(path)
        except FacebenchError:
            continue
        sweep_id = results.tags.get("sweep_id")
        if results.multirun and sweep_id and f"sweep-{sweep_id}" not in keys:
            keys.append(f"sweep-{sweep_id}")
            search = f"tags.sweep_id = '{sweep_id}'"
            views.publish(client, experiment_id, keys[-1], keys[-1], search)
    return [views.runs_url(experiment_id, key, ui_address(tracking_uri())) for key in keys]


def upload_all(paths: list[Path]) -> int:
    """Every run found under `paths` into the tracking store; the number that failed."""
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri()
    check_server(uri)
    check_writable_store(uri)
    files = [file for path in paths for file in results_files(path)]
    failed = 0
    with bounded_http_retries():
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        experiment_id = ensure_experiment(client, uri, EXPERIMENT)
        for path in files:
            try:
                log.info("%s", upload(client, experiment_id, path))
            except FacebenchError as error:
                log.error("%s", error)
                failed += 1
            except Exception as error:  # MLflow's, for a store that fails now
                log.error("%s: not put into MLflow (%s)", path.parent, failure_reason(error))
                failed += 1
        urls = _publish_sweep_views(client, experiment_id, files)
    for url in urls or [views.runs_url(experiment_id, ALL_RUNS_VIEW, ui_address(uri))]:
        log.info("side by side in MLflow: %s", url)
    if ui_command(uri):
        log.info("(start the UI first: %s)", ui_command(uri))
    return failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m facebench.upload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", type=Path, help="a job's folder, or a folder of jobs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        failed = upload_all(args.paths)
    except FacebenchError as error:
        log.error("%s", error)
        sys.exit(1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
