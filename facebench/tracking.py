"""MLflow: one run per job in the `facebench` experiment, in a SQLite store at the project root.

The store is `sqlite:///<project root>/mlflow.db` whatever the working directory (a relative URI
would give every Hydra job its own database); MLFLOW_TRACKING_URI overrides it. Artifacts go in a
`mlruns/` folder beside the database. Training runs, and nothing else, go in `facebench`;
reports and advice go in `facebench-reports`. Each experiment carries a shared view of the runs
table (facebench.mlflow_views) whose URL opens the headline numbers side by side.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from facebench import mlflow_views as views
from facebench.errors import TrackingError
from facebench.paths import PROJECT_ROOT
from facebench.printable import printable, printable_mapping
from facebench.tracking_store import check_server, check_writable_store, store_lock

log = logging.getLogger(__name__)

EXPERIMENT = "facebench"
REPORTS_EXPERIMENT = "facebench-reports"
ALL_RUNS_VIEW = "facebench"  # the shared view of every training run
SYSTEM_METRICS_INTERVAL_S = 1
_SIGNIFICANT_DIGITS = 6  # far finer than any measurement here repeats
_PARAM_LIMIT = 6000  # MLflow's longest param value


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """`mlruns/` beside a SQLite store; for a server, let the server decide."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlruns").as_uri()
    return None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'loader': {'name': 'x'}} -> {'loader.name': 'x'}, for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def git_commit() -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() or "unknown"


def rounded(value: float) -> float:
    """A metric as facebench logs it: 6 significant digits, not 13 decimals of noise."""
    return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")


def ui_address(uri: str) -> str:
    """Where the MLflow UI for this store is: the server itself, or `mlflow ui`'s default."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else views.UI_ADDRESS


def ui_command(uri: str) -> str:
    return "" if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri {uri}"


class Tracker:
    """The run of one job. `Tracker(enabled=False)` records nothing and costs nothing."""

    def __init__(self, enabled: bool = True, experiment: str = EXPERIMENT) -> None:
        self.enabled = enabled
        self.experiment = experiment
        self.run_id: str | None = None
        self.experiment_id: str | None = None

    @contextmanager
    def run(
        self,
        name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        system_metrics: bool = False,
    ) -> Iterator[Tracker]:
        """Open a run; it ends FINISHED, FAILED on an error, KILLED on Ctrl-C.

        system_metrics: MLflow's own CPU, memory, disk, network (and GPU) sampling, every second.
        """
        if not self.enabled:
            yield self
            return
        import mlflow

        uri = tracking_uri()
        check_server(uri)
        check_writable_store(uri)
        try:
            with store_lock(uri):
                mlflow.set_tracking_uri(uri)
                experiment_id = self.experiment_id = _experiment_id(mlflow, uri, self.experiment)
                if system_metrics:
                    mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)
                    mlflow.set_system_metrics_samples_before_logging(1)
                active = mlflow.start_run(
                    experiment_id=experiment_id,
                    run_name=name,
                    tags=dict(tags),
                    log_system_metrics=system_metrics,
                )
        except Exception as error:  # MLflow raises many types for a bad store
            raise TrackingError(
                f"MLflow store {uri} cannot be used: {error}. Check that it is writable, "
                "set MLFLOW_TRACKING_URI to another store, or run with tracking=false"
            ) from error
        self.run_id = active.info.run_id
        log.info("MLflow run %s (%s) in %s", name, self.run_id, uri)
        status = "FAILED"
        try:
            self.log_params(params)
            yield self
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            mlflow.end_run(status=status)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Every param that has a value (an empty data.root says nothing)."""
        if not self.enabled:
            return
        import mlflow

        mlflow.log_params(
            {
                key: printable(str(value))[:_PARAM_LIMIT]  # a data.root with odd bytes, say
                for key, value in params.items()
                if value is not None and value != ""
            }
        )

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled:
            return
        import mlflow

        mlflow.log_metrics({name: rounded(value) for name, value in metrics.items()}, step=step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags known only once the run has measured something (its dominant stage)."""
        if not self.enabled:
            return
        import mlflow

        mlflow.set_tags(dict(tags))

    def share_view(self, key: str, title: str, search_filter: str) -> str | None:
        """Publish a runs-table view of the runs `search_filter` selects; its URL."""
        if not self.enabled or self.experiment_id is None:
            return None
        from mlflow import MlflowClient

        views.publish(MlflowClient(), self.experiment_id, key, title, search_filter)
        return views.runs_url(self.experiment_id, key, ui_address(tracking_uri()))

    def url(self, key: str = ALL_RUNS_VIEW) -> str | None:
        if not self.enabled or self.experiment_id is None:
            return None
        return views.runs_url(self.experiment_id, key, ui_address(tracking_uri()))

    def log_dict(self, value: Mapping[str, Any], name: str) -> None:
        """A small JSON artifact (the class-to-index map)."""
        if self.enabled:
            import mlflow

            mlflow.log_dict(printable_mapping(value), name)  # class folders with odd bytes

    def log_artifact(self, path: Path) -> None:
        if not self.enabled or not path.is_file():
            return
        import mlflow

        mlflow.log_artifact(str(path))


def _experiment_id(mlflow: Any, uri: str, name: str = EXPERIMENT) -> str:
    """The experiment's id, created the first time with the tags the UI needs."""
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        try:
            mlflow.create_experiment(name, artifact_location=artifact_root(uri))
        except Exception:
            if mlflow.get_experiment_by_name(name) is None:
                raise
            # Another job of the same sweep created it a moment ago.
        experiment = mlflow.get_experiment_by_name(name)
    missing = {views.EXPERIMENT_KIND_TAG, views.SHARED_VIEW_TAG + ALL_RUNS_VIEW} - set(
        experiment.tags
    )
    if missing:
        client = mlflow.MlflowClient()
        # The tag MLflow versions before 3.17 read to open the runs table, not the GenAI view.
        client.set_experiment_tag(
            experiment.experiment_id, views.EXPERIMENT_KIND_TAG, views.TRAINING_KIND
        )
        title = "every run" if name == EXPERIMENT else name
        views.publish(
            client, experiment.experiment_id, ALL_RUNS_VIEW, title, "", views.NEWEST_FIRST
        )
    return experiment.experiment_id


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    """The run's results as JSON, so nothing measured depends on the tracking store."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
