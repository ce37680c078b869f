"""A watched loader's record: results.json in its folder, and the MLflow run made from it once a
loop has ended (facebench/tracking/replay.py, as `python -m facebench.upload` makes one).

The run goes where the script's own runs go: nested under the script's active MLflow run (its
experiment, its store), which watch never ends or replaces; else into the store the script set
(mlflow.set_tracking_uri, MLFLOW_TRACKING_URI), else facebench's, experiment `facebench` unless
named. Nothing of the script's MLflow state is changed: the run is written through a client of
its own. A store that cannot take it costs the script one line; results.json keeps everything.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from facebench.errors import TrackingError
from facebench.measure.epoch_lines import summarise
from facebench.results import TRACKING_LOGGED, TRACKING_LOST, JobResults, now_ms
from facebench.tracking.replay import replay
from facebench.tracking.store import (
    EXPERIMENT,
    bounded_http_retries,
    check_server,
    check_writable_store,
    ensure_experiment,
    tracking_uri,
    ui_command,
)
from facebench.tracking.tracker import UPLOAD_COMMAND, failure_reason

log = logging.getLogger("facebench.watch")

# What MLflow and its migrations say, at INFO, while a new store's tables are made.
_CHATTY = ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic")
PARENT_TAG = "mlflow.parentRunId"  # what makes the MLflow UI show a run under another


class Record:
    """One watched loader's run: its epochs so far, kept in `folder`, put into MLflow."""

    def __init__(
        self, results: JobResults, folder: Path, experiment: str | None, tracking: bool
    ) -> None:
        self.results = results
        self.folder = folder
        self.experiment = experiment
        self.tracking = tracking
        self._parent = _active_run()  # the script's run when watch began, if it had one
        if self._parent is not None:
            results.tags[PARENT_TAG] = self._parent.info.run_id

    def add(self, epochs: list[dict[str, float]], status: str) -> None:
        """Epochs measured since the last `save`, and the status the loop ended with."""
        self.results.epochs.extend(epochs)
        if self.results.epochs:
            self.results.metrics = {**self.results.epochs[-1], **summarise(self.results.epochs)}
        self.results.status = status

    def save(self) -> None:
        """results.json written, then the run put into MLflow; never raises."""
        results = self.results
        results.end_time_ms = now_ms()
        try:
            path = results.write(self.folder)
        except OSError as error:
            log.error("watch: %s could not be written (%s)", self.folder, error.strerror)
            return
        if not self.tracking:
            return
        uri = self._uri()
        try:
            check_server(uri)
            check_writable_store(uri)
            with bounded_http_retries(), _quiet(_CHATTY):
                run_id = self._logged(uri)
        except Exception as error:  # MLflow raises many types for a store that fails
            results.tracking = TRACKING_LOST
            results.tracking_error = failure_reason(error)
            results.write(self.folder)
            store = "" if uri == tracking_uri() else f"MLFLOW_TRACKING_URI={uri} "
            log.warning(
                "watch: MLflow store %s did not take run %s (%s); everything it measured is "
                "in %s. Once the store answers: %s%s %s",
                uri,
                results.run_name,
                _reason(error),
                path,
                store,
                UPLOAD_COMMAND,
                self.folder,
            )
            return
        first = not results.run_id
        results.run_id, results.tracking, results.tracking_error = run_id, TRACKING_LOGGED, ""
        results.write(self.folder)
        if first:
            nested = f", under your run {self._parent.info.run_id}" if self._parent else ""
            shown = ui_command(uri)
            log.info(
                "watch: MLflow run %s (%s) in %s%s; results.json in %s%s",
                results.run_name,
                run_id,
                uri,
                nested,
                self.folder,
                f" (to see it: {shown})" if shown else "",
            )

    def _uri(self) -> str:
        if self._parent is not None or _script_chose_store():
            import mlflow

            return mlflow.get_tracking_uri()
        return tracking_uri()

    def _logged(self, uri: str) -> str:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        if self._parent is not None:
            experiment_id = self._parent.info.experiment_id
        else:
            experiment_id = ensure_experiment(client, uri, self.experiment or EXPERIMENT)
        run = client.get_run(self.results.run_id) if self.results.run_id else None
        return replay(client, experiment_id, self.results, self.folder, run, True)


# The record of each loader watched in this process: a new watch of the same loader (one per
# epoch) adds its epochs to the same run.
_RECORDS: weakref.WeakKeyDictionary[Any, Record] = weakref.WeakKeyDictionary()


def record_for(
    loader: Any,
    run_name: str | None,
    experiment: str | None,
    tracking: bool,
    folder: str | Path | None,
    settings: dict[str, Any],
) -> Record:
    """The loader's record where it was watched before (under the same run name, which keeps
    the first watch's folder and tracking), else a new one."""
    try:
        found = _RECORDS.get(loader)
    except TypeError:  # not weakly referable (a list): a run of its own each time
        found = None
    if found is not None and run_name in (None, found.results.run_name):
        return found
    record = new_record(loader, run_name, experiment, tracking, folder, settings)
    with contextlib.suppress(TypeError):  # not weakly referable
        _RECORDS[loader] = record
    return record


def new_record(
    loader: Any,
    run_name: str | None,
    experiment: str | None,
    tracking: bool,
    folder: str | Path | None,
    settings: dict[str, Any],
) -> Record:
    """A new record for a watched loader: its run named by what it loads and how
    (watch-ImageFolder-w4-bs64), its params the DataLoader's settings, its folder
    outputs/watch/<time>-<run name> unless given."""
    dataset = getattr(loader, "dataset", None)
    what = type(dataset if dataset is not None else loader)
    params: dict[str, Any] = {
        "loader": "watch",
        "dataset": f"{what.__module__}.{what.__qualname__}",
    }
    for name in ("num_workers", "batch_size", "prefetch_factor", "pin_memory"):
        value = getattr(loader, name, None)
        if value is not None:
            params["n_workers" if name == "num_workers" else name] = value
    if getattr(loader, "persistent_workers", False):
        params["persistent_workers"] = True
    params.update(settings)
    name = run_name or _run_name(what.__name__, params)
    try:
        length = f" {len(dataset):,}" if dataset is not None else ""
    except TypeError:
        length = ""
    tags = {
        "data_set": f"own {what.__name__}{length}",
        "samples_checked": "not checked (each once, labels, pixels)",
        "facebench.watch": "true",
    }
    results = JobResults(name, params, tags)
    results.tags["job_id"] = results.job_id
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    where = Path(folder) if folder is not None else Path("outputs", "watch", f"{stamp}-{name}")
    return Record(results, where.resolve(), experiment, tracking)


def _run_name(what: str, params: dict[str, Any]) -> str:
    workers = f"-w{params['n_workers']}" if "n_workers" in params else ""
    batch = f"-bs{params['batch_size']}" if params.get("batch_size") else ""
    return f"watch-{what}{workers}{batch}"


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """These loggers at WARNING for the block: MLflow's lines as it creates a store's tables are
    not the script's business."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)


def _active_run() -> Any:
    """The script's active MLflow run; none where the script has not imported MLflow (watch
    does not import it to find out: it takes seconds)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    try:
        return mlflow.active_run()
    except Exception:  # an MLflow without the fluent API's state, a broken store
        return None


def _script_chose_store() -> bool:
    """Whether the script set its MLflow store (set_tracking_uri, or MLFLOW_TRACKING_URI,
    which facebench's own store also follows)."""
    if "mlflow" not in sys.modules:
        return False
    try:
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set
    except ImportError:
        return False
    return bool(is_tracking_uri_set())


def _reason(error: BaseException) -> str:
    if isinstance(error, TrackingError):
        return str(error).split(" (", 1)[-1].split(")", 1)[0]
    return failure_reason(error)
