"""A tracking store that fails once a run has started loses nothing: the job finishes, its
results.json keeps everything, and facebench.upload puts it into MLflow later, once."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from facebench.errors import TrackingLost
from facebench.host.paths import PROJECT_ROOT
from facebench.host.ports import free_port
from facebench.results import TRACKING_LOST, JobResults
from facebench.run.runner import run_training
from facebench.tracking import run_owner
from facebench.tracking.tracker import failure_reason, rounded
from facebench.upload import UPLOADED_TAG, upload_all
from tests.helpers import workers_up


def job_metrics(run) -> dict[str, float]:
    """A run's metrics but MLflow's own system sampling."""
    return {k: v for k, v in run.data.metrics.items() if not k.startswith("system/")}


def as_logged(results: JobResults) -> dict[str, float]:
    return {key: rounded(value) for key, value in results.metrics.items()}


def test_failure_reasons_are_a_few_words():
    refused = Exception(
        "API request to http://127.0.0.1:5077/api/2.0/mlflow/runs/log-batch failed with "
        "exception HTTPConnectionPool(host='127.0.0.1', port=5077): Max retries exceeded with "
        "url: /api/2.0/mlflow/runs/log-batch (Caused by NewConnectionError('<urllib3.connection."
        "HTTPConnection object at 0x7f>: Failed to establish a new connection: [Errno 111] "
        "Connection refused'))"
    )
    assert failure_reason(refused) == "Connection refused"
    assert failure_reason(ValueError("database is locked\nmore")) == (
        "ValueError: database is locked"
    )


@pytest.fixture
def store(tmp_path, empty_store, monkeypatch) -> str:
    """A private SQLite store, as MLFLOW_TRACKING_URI."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_a_store_that_fails_mid_run_stops_nothing(make_cfg, tmp_path, store, monkeypatch, caplog):
    """The second metrics call fails (as a server that went away would): one line, the epochs
    go on, results.json holds every epoch, and the run is off MLflow's stack of active runs,
    so the next job of a sweep in this process opens its own."""
    calls = []
    log_metrics = mlflow.log_metrics

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) >= 2:
            raise ConnectionError("[Errno 111] Connection refused")
        return log_metrics(*args, **kwargs)

    monkeypatch.setattr(mlflow, "log_metrics", failing)
    cfg = make_cfg("tracking=true", "repeat=3")
    with caplog.at_level(logging.INFO), pytest.raises(TrackingLost) as raised:
        run_training(cfg, output_dir=tmp_path / "out")
    assert len(calls) == 2  # no call after the failure
    said = [r.getMessage() for r in caplog.records if "MLflow failed while" in r.getMessage()]
    assert said == [
        "MLflow failed while logging metrics (Connection refused): run dataset-w0-bs8-loader-only "
        f"goes on without it; everything it records is kept in {tmp_path / 'out'}/results.json. "
        f"Once MLflow answers: python -m facebench.upload {tmp_path / 'out'}"
    ]
    assert str(raised.value).startswith("run dataset-w0-bs8-loader-only finished but is not in")
    results = JobResults.read(tmp_path / "out" / "results.json")
    assert (results.status, results.tracking) == ("FINISHED", TRACKING_LOST)
    assert len(results.epochs) == 3 and results.metrics["measured_epochs"] == 3
    assert results.end_time_ms >= results.start_time_ms > 0
    assert mlflow.active_run() is None

    monkeypatch.setattr(mlflow, "log_metrics", log_metrics)  # the store answers again
    # Its process has ended: a run opened now would close it as KILLED; the upload completes it.
    MlflowClient(store).update_run(MlflowClient(store).search_runs(["1"])[0].info.run_id, "RUNNING")
    assert run_owner.close_orphans(MlflowClient(store), "1", store) == [
        "dataset-w0-bs8-loader-only"
    ]
    assert upload_all([tmp_path / "out"]) == 0
    [run] = MlflowClient(store).search_runs(["1"])
    assert run.info.status == "FINISHED" and run.data.tags[UPLOADED_TAG] == "true"
    assert run_owner.ENDED_TAG not in run.data.tags
    assert job_metrics(run) == as_logged(results)
    history = MlflowClient(store).get_metric_history(run.info.run_id, "images_per_s")
    assert sorted(point.step for point in history) == [0, 1, 2]  # epoch 0's not logged twice


def test_a_sweep_run_without_tracking_is_uploaded_once_with_its_view(
    make_cfg, tmp_path, store, caplog
):
    sweep = tmp_path / "multirun"
    for job, workers in enumerate((0, 1)):
        cfg = make_cfg("tracking=false", f"n_workers={workers}")
        run_training(cfg, output_dir=sweep / str(job), sweep_id="abc123", multirun=True)
    (sweep / "2").mkdir()  # a job that recorded nothing
    shutil.copy(sweep / "0" / "results.json", tmp_path / "copy.json")

    with caplog.at_level(logging.INFO, logger="facebench.upload"):
        assert upload_all([sweep]) == 0
    client = MlflowClient(store)
    found = client.search_runs(["1"], filter_string="tags.sweep_id = 'abc123'")
    assert sorted(run.info.run_name for run in found) == [
        "dataset-w0-bs8-loader-only",
        "dataset-w1-bs8-loader-only",
    ]
    for run in found:
        job = 0 if run.info.run_name.startswith("dataset-w0") else 1
        results = JobResults.read(sweep / str(job) / "results.json")
        assert job_metrics(run) == as_logged(results)
        assert run.data.params["n_workers"] == str(job)
        assert run.data.tags["data_set"] == "synthetic 120"
        assert (run.info.start_time, run.info.end_time) == (
            results.start_time_ms,
            results.end_time_ms,
        )
        names = {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
        assert "results.json" in names
    assert "mlflow.sharedViewState.sweep-abc123" in client.get_experiment("1").tags
    urls = [r.getMessage() for r in caplog.records if "side by side" in r.getMessage()]
    assert urls == [
        "side by side in MLflow: http://127.0.0.1:5000/#/experiments/1/runs?"
        "viewStateShareKey=sweep-abc123&workflowType=machine_learning"
    ]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="facebench.upload"):
        assert upload_all([sweep]) == 0
    assert len(client.search_runs(["1"])) == 2
    said = [r.getMessage() for r in caplog.records]
    assert sum("is already in MLflow; nothing added" in line for line in said) == 2
    assert (sweep / "0" / "results.json").read_bytes() == (tmp_path / "copy.json").read_bytes()


def test_upload_names_a_folder_with_nothing_to_upload(tmp_path, store, caplog):
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "results.json").write_text(json.dumps({"shards_dir": "x"}))
    with caplog.at_level(logging.INFO, logger="facebench.upload"):
        assert upload_all([tmp_path / "prepared"]) == 1
    assert any("not the results of a train.py job" in r.getMessage() for r in caplog.records)


# With a real tracking server, started and stopped by the test.


class Server:
    """`mlflow server` on 127.0.0.1 over a SQLite store; stopped by its own process group."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.uri = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{self.folder / 'server.db'}",
            "--artifacts-destination",
            str(self.folder / "artifacts"),
        ]
        log = open(self.folder / "server.log", "a")  # noqa: SIM115
        self.process = subprocess.Popen(
            command, stdout=log, stderr=log, cwd=self.folder, start_new_session=True
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "server.log").read_text()
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("mlflow server did not start within 90 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # uvicorn's worker with it
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    running = Server(folder, free_port())
    try:
        yield running
    finally:
        running.stop()


def python(*args: str, env: dict, **run) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300, **run
    )


@pytest.mark.slow
def test_a_server_that_stops_mid_epoch_loses_nothing(
    tmp_path, cache, synthetic_root, isolated_env, server
):
    # synthetic_root: the set exists before the run, whose generating processes would otherwise
    # pass for its workers and stop the server before the run has begun.
    server.start()
    env = dict(isolated_env, MLFLOW_TRACKING_URI=server.uri)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            f"data.cache_dir={cache}",
            "data.n_images=120",
            # Epochs of seconds that cost no CPU: an emulated accelerator's steps, slept
            # (ResNet-18 on the CPU took as long and kept both cores busy).
            "model=none",
            "accelerator=custom",
            "accelerator.images_per_s=40",
            "accelerator.host_cpu=0",
            "batch_size=8",
            "n_workers=2",
            "repeat=2",
            "device=cpu",
            f"hydra.run.dir={out}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    workers_up(process, 2, time.monotonic() + 120)  # the first epoch is under way
    server.stop()
    stopped = time.monotonic()
    output = process.communicate(timeout=300)[0]
    ended_after = time.monotonic() - stopped

    assert process.returncode == 3, output[-3000:]
    assert "Traceback" not in output and "Retrying" not in output, output[-3000:]
    lines = output.splitlines()
    [lost] = [line for line in lines if "MLflow failed while" in line]
    assert "goes on without it; everything it records is kept in" in lost
    assert lost.endswith(f"Once MLflow answers: python -m facebench.upload {out}")
    assert lines[-1].endswith(
        f"everything it recorded is in {out}/results.json. Once MLflow answers: "
        f"python -m facebench.upload {out}"
    )
    results = JobResults.read(out / "results.json")
    assert (results.status, results.tracking, len(results.epochs)) == (
        "FINISHED",
        TRACKING_LOST,
        2,
    )
    epochs_s = sum(epoch["epoch_time_s"] for epoch in results.epochs)
    assert ended_after < epochs_s + 30, "the store's failure cost more than seconds"

    server.start()  # the same store, the same address
    first = python("-m", "facebench.upload", str(out), env=env)
    assert first.returncode == 0, first.stderr
    assert f"{out}: run {results.run_name} put into MLflow (completed the run" in first.stderr
    client = MlflowClient(server.uri)
    [run] = client.search_runs(["1"])
    assert run.info.status == "FINISHED"
    assert job_metrics(run) == as_logged(results)
    names = {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
    assert {"results.json", "config.yaml"} <= names
    history = len(client.get_metric_history(run.info.run_id, "images_per_s"))

    second = python("-m", "facebench.upload", str(out), env=env)
    assert second.returncode == 0, second.stderr
    assert "is already in MLflow; nothing added" in second.stderr
    [again] = client.search_runs(["1"])
    assert again.data.metrics == run.data.metrics
    assert len(client.get_metric_history(run.info.run_id, "images_per_s")) == history == 2


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (("data=folder", "data.root=/nonexistent/faces"), "/nonexistent/faces"),
        (("n_workers=100000",), "n_workers=100000: 100000 workers of loader=dataset need"),
        (("loader=litdata",), "loader=litdata needs litdata, which is not installed"),
    ],
)
def test_a_run_refused_on_its_data_or_resources_leaves_no_run(
    make_cfg, tmp_path, store, monkeypatch, overrides, says
):
    """A typo, a worker count the memory cannot hold, a library not installed: refused before
    an MLflow run opens, so the store holds no FAILED run named like the user's real one."""
    from importlib import util

    from facebench.errors import FacebenchError

    find_spec = util.find_spec
    monkeypatch.setattr(  # as if the litdata extra were not installed
        util, "find_spec", lambda name, *a: None if name == "litdata" else find_spec(name, *a)
    )
    with pytest.raises(FacebenchError, match=says):
        run_training(make_cfg("tracking=true", *overrides), output_dir=tmp_path / "out")
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("facebench")
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []
    results = JobResults.read(tmp_path / "out" / "results.json")
    assert (results.status, results.tracking, results.run_id) == ("FAILED", "off", "")
