"""A job's results.json into MLflow as the run it would have been: its name, params, tags, each
epoch's metrics at its step, the job's own metrics, its end and status, its artifacts. Used by
`python -m facebench.upload` (a run whose store failed, or that ran without one) and by `watch`,
which records each run this way once its loop has ended (nothing to end if the script dies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from facebench.results import RESULTS, JobResults, now_ms
from facebench.tracking.tracker import param_values, rounded

# MLflow's limits for one log_batch call.
_BATCH = {"metrics": 1000, "params": 100, "tags": 100}


def replay(
    client: Any,
    experiment_id: str,
    results: JobResults,
    folder: Path,
    run: Any,
    job_metrics_again: bool = False,
) -> str:
    """`results` into `run` (an MLflow Run that holds part of it already: what it holds is not
    logged twice), or into a new run of the experiment where `run` is None; its run id.
    `job_metrics_again`: the job's own metrics logged anew (more epochs changed them)."""
    if run is None:
        run = client.create_run(
            experiment_id,
            start_time=results.start_time_ms,
            tags={"job_id": results.job_id},
            run_name=results.run_name,
        )
    run_id = run.info.run_id
    logged = _logged_points(client, run)
    _log_all(client, run_id, results, logged, job_metrics_again)
    _log_artifacts(client, run_id, folder, results)
    client.set_terminated(run_id, results.status, end_time=results.end_time_ms or now_ms())
    return run_id


def _logged_points(client: Any, run: Any) -> set[tuple[str, int]]:
    """(metric, step) pairs a run already holds: those the job logged before MLflow failed,
    not to be logged twice."""
    return {
        (key, point.step)
        for key in run.data.metrics
        for point in client.get_metric_history(run.info.run_id, key)
    }


def _log_all(
    client: Any, run_id: str, results: JobResults, logged: set[tuple[str, int]], again: bool
) -> None:
    """Params, tags and metrics as the job would have logged them: each epoch's at its step,
    the job's own (summaries, shard and listing times) at step 0; none already `logged` but,
    `again`, the job's own."""
    from mlflow.entities import Metric, Param, RunTag

    when = results.end_time_ms or now_ms()
    last_epoch = results.epochs[-1] if results.epochs else {}
    points = [
        (key, value, step)
        for step, epoch in enumerate(results.epochs)
        for key, value in epoch.items()
        if (key, step) not in logged
    ]
    points += [
        (key, value, 0)
        for key, value in results.metrics.items()
        if key not in last_epoch and (again or (key, 0) not in logged)
    ]
    metrics = [Metric(key, rounded(value), when, step) for key, value, step in points]
    params = [Param(key, value) for key, value in param_values(results.params).items()]
    tags = [RunTag(key, str(value)) for key, value in results.tags.items()]
    for kind, items in (("params", params), ("tags", tags), ("metrics", metrics)):
        size = _BATCH[kind]
        for start in range(0, len(items), size):
            client.log_batch(run_id, **{kind: items[start : start + size]})


def _log_artifacts(client: Any, run_id: str, folder: Path, results: JobResults) -> None:
    for path in (folder / RESULTS, folder / ".hydra" / "config.yaml"):
        if path.is_file():
            client.log_artifact(run_id, str(path))
    if results.classes:
        client.log_dict(run_id, results.classes, "classes.json")
