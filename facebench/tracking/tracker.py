"""A job's MLflow run: opened, logged to, ended. (Where the store is, its experiments, and
checking it: store.py.)

A store that cannot be used when a run starts stops the job at once, in one line. Once the run
has started, the measurement matters more than the store: the first call that fails (a server
gone, a store locked or full) makes the Tracker stop talking to MLflow for that run, with one
line saying so; the job finishes and keeps everything in results.json, which
`python -m facebench.upload` later puts into MLflow as the run it would have been.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from facebench.errors import TrackingError
from facebench.host.printable import printable, printable_mapping
from facebench.tracking import mlflow_views as views
from facebench.tracking import run_owner
from facebench.tracking.store import (
    ALL_RUNS_VIEW,
    EXPERIMENT,
    bounded_http_retries,
    check_server,
    check_writable_store,
    ensure_experiment,
    no_http_retries,
    store_lock,
    tracking_uri,
    ui_address,
)

log = logging.getLogger(__name__)

SYSTEM_METRICS_INTERVAL_S = 1
_SIGNIFICANT_DIGITS = 6  # far finer than any measurement here repeats
_PARAM_LIMIT = 6000  # MLflow's longest param value
# What MLflow's HTTP client and its system-metrics thread log while a store is failing: urllib3's
# retry warnings and the thread's own, each a long URL and a repr of the connection, and the
# thread may say it after the run. The one line the Tracker writes says it all instead; a
# facebench process makes no HTTP calls but MLflow's.
_NOISY_LOGGERS = ("urllib3.connectionpool", "mlflow.system_metrics")
_ERRNO_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
T = TypeVar("T")
UPLOAD_COMMAND = "python -m facebench.upload"


def param_values(params: Mapping[str, Any]) -> dict[str, str]:
    """Params as MLflow takes them: every one that has a value (an empty data.root says
    nothing), as printable text (a data.root with odd bytes, say) within MLflow's length."""
    return {
        key: printable(str(value))[:_PARAM_LIMIT]
        for key, value in params.items()
        if value is not None and value != ""
    }


def rounded(value: float) -> float:
    """A metric as facebench logs it: 6 significant digits, not 13 decimals of noise."""
    return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")


class Tracker:
    """The run of one job. `Tracker(enabled=False)` records nothing and costs nothing.

    `kept_in`: the folder whose results.json keeps what the run records, named when MLflow
    fails mid-run (with the upload command); `lost` then says why MLflow was given up on.
    """

    def __init__(
        self, enabled: bool = True, experiment: str = EXPERIMENT, kept_in: Path | None = None
    ) -> None:
        self.enabled = enabled
        self.experiment = experiment
        self.kept_in = kept_in
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.run_name = ""
        self.lost: str | None = None

    def check_store(self) -> None:
        """A store that cannot be used stops the job now, in seconds, in one line (MLflow would
        retry it for minutes): called before a job's long work, and again as its run opens."""
        if self.enabled:
            uri = tracking_uri()
            check_server(uri)
            check_writable_store(uri)

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

        self.check_store()
        uri = tracking_uri()
        with bounded_http_retries(), self._started(mlflow, uri, name, tags, system_metrics):
            self.log_params(params)
            yield self

    @contextmanager
    def _started(
        self, mlflow: Any, uri: str, name: str, tags: Mapping[str, str], system_metrics: bool
    ) -> Iterator[None]:
        owner = run_owner.Ownership(uri)  # held from before the run opens to after it ends
        try:
            with store_lock(uri):
                mlflow.set_tracking_uri(uri)
                experiment_id = self.experiment_id = ensure_experiment(
                    mlflow.MlflowClient(), uri, self.experiment
                )
                _close_orphans(mlflow, experiment_id, uri)
                if system_metrics:
                    mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)
                    mlflow.set_system_metrics_samples_before_logging(1)
                active = mlflow.start_run(
                    experiment_id=experiment_id,
                    run_name=name,
                    tags={**tags, **owner.tags()},
                    log_system_metrics=system_metrics,
                )
        except Exception as error:  # MLflow raises many types for a bad store
            owner.release()
            raise TrackingError(
                f"MLflow store {uri} cannot be used: {error}. Check that it is writable, "
                "set MLFLOW_TRACKING_URI to another store, or run with tracking=false"
            ) from error
        self.run_id, self.run_name = active.info.run_id, name
        log.info("MLflow run %s (%s) in %s", name, self.run_id, uri)
        for logger in _NOISY_LOGGERS:
            logging.getLogger(logger).setLevel(logging.ERROR)
        status = "FAILED"
        try:
            yield
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            self._end(status)
            owner.release()

    def _end(self, status: str) -> None:
        import mlflow

        self._call("ending the run", lambda: mlflow.end_run(status=status))
        if self.lost is None:
            return
        _stop_system_metrics(self.run_id)
        if mlflow.active_run() is not None:
            # end_run takes the run off MLflow's stack of active runs before it tells the store;
            # with the store gone, that is all that is wanted (the next job of a sweep opens its
            # own run), and it is not worth a wait.
            with no_http_retries():
                try:
                    mlflow.end_run(status=status)
                except Exception:
                    log.debug("the lost run could not be ended in MLflow", exc_info=True)

    def _call(self, what: str, call: Callable[[], T]) -> T | None:
        """One call to MLflow, unless the run has none or gave MLflow up; the first failure
        gives it up (see the module's docstring)."""
        if not self.enabled or self.lost is not None:
            return None
        try:
            return call()
        except Exception as error:  # MLflow and its HTTP client raise many types
            self.lost = f"{what}: {failure_reason(error)}"
            kept = self.kept_in / "results.json" if self.kept_in else None
            log.error(
                "MLflow failed while %s (%s): run %s goes on without it%s",
                what,
                failure_reason(error),
                self.run_name,
                f"; everything it records is kept in {kept}. Once MLflow answers: "
                f"{UPLOAD_COMMAND} {self.kept_in}"
                if kept
                else "",
            )
            return None

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Every param that has a value (an empty data.root says nothing)."""
        if not self.enabled:
            return
        import mlflow

        values = param_values(params)
        self._call("logging params", lambda: mlflow.log_params(values))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled:
            return
        import mlflow

        values = {name: rounded(value) for name, value in metrics.items()}
        self._call("logging metrics", lambda: mlflow.log_metrics(values, step=step))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags known only once the run has measured something (its dominant stage)."""
        if not self.enabled:
            return
        import mlflow

        self._call("setting tags", lambda: mlflow.set_tags(dict(tags)))

    def share_view(self, key: str, title: str, search_filter: str) -> str | None:
        """Publish a runs-table view of the runs `search_filter` selects; its URL."""
        if not self.enabled or self.experiment_id is None:
            return None
        from mlflow import MlflowClient

        self._call(
            "publishing a runs view",
            lambda: views.publish(MlflowClient(), self.experiment_id, key, title, search_filter),
        )
        if self.lost is not None:
            return None  # facebench.upload publishes it
        return views.runs_url(self.experiment_id, key, ui_address(tracking_uri()))

    def url(self, key: str = ALL_RUNS_VIEW) -> str | None:
        if not self.enabled or self.experiment_id is None:
            return None
        return views.runs_url(self.experiment_id, key, ui_address(tracking_uri()))

    def log_dict(self, value: Mapping[str, Any], name: str) -> None:
        """A small JSON artifact (the class-to-index map)."""
        if self.enabled:
            import mlflow

            mapping = printable_mapping(value)  # class folders with odd bytes
            self._call(f"logging {name}", lambda: mlflow.log_dict(mapping, name))

    def log_artifact(self, path: Path) -> None:
        if not self.enabled or not path.is_file():
            return
        import mlflow

        self._call(f"logging {path.name}", lambda: mlflow.log_artifact(str(path)))


def failure_reason(error: BaseException) -> str:
    """A failed MLflow call in a few words: the system's own reason where there is one
    ('Connection refused'), not the URL, the retry policy and a repr of the connection."""
    text = str(error)
    found = _ERRNO_REASON.findall(text)
    if found:
        return found[-1].strip()
    if "Read timed out" in text:
        return "no answer in time (read timed out)"
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def _close_orphans(mlflow: Any, experiment_id: str, uri: str) -> None:
    """Runs left RUNNING by a killed process, closed (facebench.tracking.run_owner). Housekeeping: a
    failure here is logged and the new run goes on."""
    try:
        run_owner.close_orphans(mlflow.MlflowClient(), experiment_id, uri)
    except Exception as error:  # MLflow raises many types
        log.warning("runs left RUNNING by killed processes were not checked: %s", error)


def _stop_system_metrics(run_id: str | None) -> None:
    """Stop MLflow's system-metrics thread for a run whose store failed. end_run stops it only
    once the store has taken the run's end; left running, the thread would log this process's
    next job's CPU and memory into this run if the store came back."""
    from mlflow.tracking import fluent

    monitor = fluent.run_id_to_system_metrics_monitor.pop(run_id, None)
    shutdown = getattr(monitor, "_shutdown_event", None)
    if shutdown is not None:
        shutdown.set()  # the thread ends at its next look, without a wait here
