"""The MLflow store: where it is, its experiments, and checking it before a run uses it.

The store is `sqlite:///<project root>/mlflow.db` whatever the working directory (a relative URI
would give every Hydra job its own database); MLFLOW_TRACKING_URI overrides it. Artifacts go in a
`mlruns/` folder beside the database. Training runs, and nothing else, go in `facebench`;
reports and advice go in `facebench-reports`. Each experiment carries a shared view of the runs
table (facebench.tracking.mlflow_views) whose URL opens the headline numbers side by side.

A store is checked in seconds before a run uses it: a server that does not answer, a SQLite store
that cannot be written (MLflow would retry either for minutes); a run's calls to a server retry
for seconds, not minutes; one job at a time creates a new SQLite store's tables."""

from __future__ import annotations

import fcntl
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from facebench.errors import TrackingError
from facebench.host.paths import PROJECT_ROOT
from facebench.tracking import mlflow_views as views

EXPERIMENT = "facebench"
REPORTS_EXPERIMENT = "facebench-reports"
ALL_RUNS_VIEW = "facebench"  # the shared view of every training run


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """`mlruns/` beside a SQLite store; for a server, let the server decide."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlruns").as_uri()
    return None


def ui_address(uri: str) -> str:
    """Where the MLflow UI for this store is: the server itself, or `mlflow ui`'s default."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else views.UI_ADDRESS


def ui_command(uri: str) -> str:
    return "" if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri {uri}"


def ensure_experiment(client: Any, uri: str, name: str = EXPERIMENT) -> str:
    """The experiment's id, created the first time with the tags the UI needs (the runs view
    of every run among them). `client`: an MlflowClient of the store at `uri`."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            client.create_experiment(name, artifact_location=artifact_root(uri))
        except Exception:
            if client.get_experiment_by_name(name) is None:
                raise
            # Another job of the same sweep created it a moment ago.
        experiment = client.get_experiment_by_name(name)
    missing = {views.EXPERIMENT_KIND_TAG, views.SHARED_VIEW_TAG + ALL_RUNS_VIEW} - set(
        experiment.tags
    )
    if missing:
        # The tag MLflow versions before 3.17 read to open the runs table, not the GenAI view.
        client.set_experiment_tag(
            experiment.experiment_id, views.EXPERIMENT_KIND_TAG, views.TRAINING_KIND
        )
        title = "every run" if name == EXPERIMENT else name
        views.publish(
            client, experiment.experiment_id, ALL_RUNS_VIEW, title, "", views.NEWEST_FIRST
        )
    return experiment.experiment_id


_SERVER_TIMEOUT_S = 5
# MLflow retries a server that does not answer for minutes, with backoff (7 retries, 120 s
# each). A run's calls retry once, about a second later, and wait 10 s for an answer: a server
# that restarts meanwhile is kept; one that is gone costs seconds, and the run goes on without
# it (facebench.tracking.tracker). Variables the user set are left as they are.
_RUN_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
# For a call whose answer no longer matters (ending a run whose store is gone).
_NO_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}


@contextmanager
def bounded_http_retries() -> Iterator[None]:
    """MLflow's HTTP calls in the block retry as a run's should (see _RUN_HTTP)."""
    with _environment({k: v for k, v in _RUN_HTTP.items() if k not in os.environ}):
        yield


@contextmanager
def no_http_retries() -> Iterator[None]:
    """MLflow's HTTP calls in the block try once, briefly."""
    with _environment(_NO_RETRIES):
        yield


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """These environment variables set while the block runs (MLflow reads its own at each
    request), then put back as they were."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_server(uri: str) -> None:
    """A tracking server must answer its health check within seconds, or the run stops now."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=_SERVER_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return  # it answered; a server behind a proxy may not have /health
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise TrackingError(
            f"MLflow server {uri} does not answer ({reason}). Start it (mlflow server), fix "
            "MLFLOW_TRACKING_URI, or run with tracking=false"
        ) from None


def check_writable_store(uri: str) -> None:
    """A SQLite store's folder must take a new file and its database must open for writing:
    checked at once, where MLflow would retry a store it cannot write for about two minutes (a
    read-only mount, /proc)."""
    if not uri.startswith("sqlite:///"):
        return
    database = Path(uri.removeprefix("sqlite:///"))
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _unwritable(uri, f"its folder {database.parent} cannot be made: {error.strerror}")
    try:
        with tempfile.NamedTemporaryFile(dir=database.parent, prefix=".facebench-probe-"):
            pass
    except OSError as error:
        _unwritable(uri, f"no new file can be made in {database.parent}: {error.strerror}")
    if database.exists():
        try:
            with open(database, "r+b"):
                pass
        except OSError as error:
            _unwritable(uri, f"{database} does not open for writing: {error.strerror}")


def _unwritable(uri: str, why: str) -> NoReturn:
    raise TrackingError(
        f"MLflow store {uri} cannot be written ({why}). Set "
        "MLFLOW_TRACKING_URI=sqlite:////a/writable/folder/mlflow.db, or run with tracking=false"
    ) from None


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Jobs that start together (a launcher running a sweep in parallel) would each create a new
    SQLite store's tables at once and trip over each other; one at a time, they do not."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///"))
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        lock = open(database.with_name(database.name + ".lock"), "a")  # noqa: SIM115
    except OSError:
        yield  # an unusable folder: let MLflow report it
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
