"""loader=raydata's Ray: a local instance that lives as long as the job, a two-node cluster on
this machine that decodes one epoch on both nodes, and the ways a run on Ray fails (a worker
killed mid-epoch, an address that does not answer): one line, a FAILED run (or, refused
before it began, none), nothing left."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import psutil
import pytest

from facebench.errors import LoaderFailure
from facebench.host.paths import PROJECT_ROOT
from facebench.host.ports import free_port
from facebench.loaders import ray_cluster, ray_one_machine
from facebench.loaders.ray_measure import stage_rows, stage_times
from facebench.stages import StageTimes
from tests.ray_watch import RayWatch

pytest.importorskip("ray.data")
# Each test counts the Ray processes its own job leaves (tests/ray_watch.py), not the machine's:
# others may run Ray beside it.
pytestmark = pytest.mark.ray


def _train(tmp_path: Path, env: dict, cache: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "loader=raydata",
            f"data.cache_dir={cache}",
            "model=none",
            "device=cpu",
            "n_workers=2",
            f"hydra.run.dir={tmp_path / 'out'}",
            *overrides,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _to_end(run: subprocess.Popen, timeout: float) -> str:
    """The run's output once it ended; killed if it runs past `timeout` (then the test fails
    on its exit status, leaving nothing running)."""
    try:
        output, _ = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.kill()
        output, _ = run.communicate(timeout=60)
    return output


def _results(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "results.json").read_text())


def _mlflow_runs(env: dict) -> list:
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    return mlflow.search_runs(experiment_names=["facebench"], output_format="list")


def _mlflow_status(env: dict) -> str:
    (run,) = _mlflow_runs(env)
    return run.info.status


def test_stage_times_travel_in_the_first_row():
    times = StageTimes((1, 2, 0, 3, 4), (5, 6, 0, 7, 8), 9, (10, 2**40), 11)
    rows = stage_rows(times, 3)
    assert rows.shape == (3, 14) and not rows[1:].any()
    import torch

    assert stage_times(torch.from_numpy(rows)) == times
    assert stage_times(torch.from_numpy(stage_rows(None, 3))) is None


def test_addresses_read_as_ray_reads_them():
    assert ray_cluster.host_port("10.0.0.1") == ("10.0.0.1", ray_cluster.GCS_PORT)
    assert ray_cluster.host_port("head:6390") == ("head", 6390)
    assert ray_cluster.host_port("ray://head") == ("head", ray_cluster.CLIENT_PORT)
    assert ray_cluster.host_port("ray://head:10002") == ("head", 10002)
    with pytest.raises(LoaderFailure, match="not a Ray address"):
        ray_cluster.host_port("head:port")


@pytest.mark.slow  # a train.py process and a Ray instance or cluster
def test_a_local_instance_lives_as_long_as_the_job(tmp_path, cache, isolated_env):
    run = _train(
        tmp_path,
        isolated_env,
        cache,
        "data.n_images=120",
        "batch_size=8",
        "loader.images_per_task=24",  # three batches a task
        "epochs=2",
    )
    watch = RayWatch(run)
    output = _to_end(run, timeout=300)
    assert run.returncode == 0, output[-3000:]
    results = _results(tmp_path)
    metrics = results["metrics"]
    assert results["status"] == "FINISHED" and _mlflow_status(isolated_env) == "FINISHED"
    # Started once, outside both epochs' clocks: ray_start_s is the job's, logged once.
    assert metrics["ray_start_s"] > 0 and metrics["ray_nodes"] == 1 and metrics["ray_cpus"] == 2
    assert metrics["measured_epochs"] == 2
    assert metrics["time_to_first_batch_s"] < metrics["ray_start_s"] + metrics["epoch_time_s"]
    assert metrics["ray_tasks"] == 120 // 24 and metrics["ray_nodes_used"] == 1
    assert metrics["samples_unique"] == metrics["samples_seen"] == 120
    assert "a local Ray instance: 1 node(s), 2 CPUs" in output
    assert watch.noted, "no Ray process of the job was seen: the check proves nothing"
    assert not watch.left(), "the job's Ray processes outlived it"


@pytest.mark.slow  # a Ray instance
def test_an_epoch_cut_short_leaves_no_ray_data_thread_at_shutdown(isolated_env):
    """Ray Data's threads left by an epoch that stopped early (its block prefetcher) end
    before Ray's shutdown, which one of them calling into Ray afterwards would turn into the
    process's end; the script then shuts Ray down and exits 0."""
    script = PROJECT_ROOT / "tests" / "ray_cut_short.py"
    run = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=isolated_env,
        cwd=PROJECT_ROOT,
    )
    watch = RayWatch(run)
    output = _to_end(run, timeout=300)
    assert run.returncode == 0, output[-3000:]
    cut = next(line for line in output.splitlines() if line.startswith("after the cut:"))
    assert cut != "after the cut: []", "the cut left no thread: the check proves nothing"
    assert "after end_threads: [] []" in output and "shut down" in output, output
    assert not watch.left()


def _decoding(watch: RayWatch) -> list[psutil.Process]:
    """The run's Ray workers running a decode task now (named for it: ray::MapBatches(...)).
    Not idle ones: killing a worker before it is given a task only makes Ray start another."""
    found = []
    for process in watch.now():
        try:
            if process.cmdline()[0].startswith("ray::MapBatches"):
                found.append(process)
        except (psutil.Error, IndexError):
            continue
    return found


@pytest.mark.slow  # a train.py process and a Ray instance or cluster
def test_a_killed_ray_worker_fails_the_run_in_one_line(tmp_path, cache, isolated_env):
    # One batch a task: many short tasks, so that kills land on some while they decode.
    run = _train(
        tmp_path,
        isolated_env,
        cache,
        "data.n_images=600",
        "batch_size=2",
        "loader.images_per_task=2",
        "repeat=50",
    )
    watch = RayWatch(run)
    lines = []
    try:
        for line in run.stdout:  # Ray takes 6 s to start here, minutes with the cores busy
            lines.append(line)
            if "raydata: a local Ray instance" in line:
                break  # Ray is up; its decode tasks start with the first epoch
        deadline = time.monotonic() + 120
        # Again until the run ends: on a busy machine a task may end between looking and
        # killing, and a worker killed between two tasks is only replaced.
        killed = 0
        while run.poll() is None and time.monotonic() < deadline:
            for worker in _decoding(watch):
                with contextlib.suppress(psutil.Error):
                    worker.kill()
                    killed += 1
            time.sleep(0.05)
        assert killed, "".join(lines)[-3000:]
        rest, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:  # a failed test leaves nothing running
            run.kill()
            run.communicate(timeout=60)
    output = "".join(lines) + rest
    assert run.returncode == 1, output[-3000:]
    errors = [line for line in output.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, output[-3000:]
    assert "loader=raydata: a Ray worker process died" in errors[0]
    assert "n_workers" in errors[0] and "loader.max_retries" in errors[0]
    assert "Traceback" not in output
    assert _results(tmp_path)["status"] == "FAILED" and _mlflow_status(isolated_env) == "FAILED"
    assert not watch.left(), "Ray processes outlived the failed run"


@pytest.mark.slow  # a train.py process and a Ray instance or cluster
def test_an_address_that_does_not_answer_fails_the_run_in_one_line(tmp_path, cache, isolated_env):
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    run = _train(
        tmp_path,
        isolated_env,
        cache,
        "data.n_images=120",
        "batch_size=8",
        f"loader.address={address}",
    )
    watch = RayWatch(run)
    output = _to_end(run, timeout=120)
    assert run.returncode == 1, output[-3000:]
    errors = [line for line in output.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, output[-3000:]
    assert f"loader.address={address}: no Ray cluster answers at {address}" in errors[0]
    assert "ray start --head" in errors[0]
    assert time.monotonic() - started < 60  # refused in seconds, not after Ray's retries
    # Refused while getting ready, as a wrong data.root is: no MLflow run, results.json kept.
    assert _results(tmp_path)["status"] == "FAILED" and not _mlflow_runs(isolated_env)
    assert not watch.noted and not watch.left(timeout=1.0)


@pytest.fixture
def two_nodes(isolated_env: dict) -> Iterator[ray_one_machine.NodesHere]:
    """Two Ray nodes on this machine, one CPU each, as on two machines: `ray start --head` and
    `ray start --address`, with a token of their own; stopped by their own processes' PIDs,
    every one of which must then be gone (one_machine_cluster raises otherwise)."""
    with ray_one_machine.one_machine_cluster(2, 1, isolated_env) as nodes:
        yield nodes
    assert not ray_one_machine.cluster_processes(nodes.temp_dir, nodes.port)


@pytest.mark.slow  # a train.py process and a Ray instance or cluster
def test_two_nodes_decode_one_epoch_each_sample_once(tmp_path, cache, two_nodes):
    address, env = two_nodes.address, two_nodes.env
    run = _train(
        tmp_path,
        env,
        cache,
        "data.n_images=600",
        "batch_size=20",
        "loader.images_per_task=20",  # a task a batch: 30 tasks for two CPUs on two nodes
        f"loader.address={address}",
    )
    output = _to_end(run, timeout=300)
    assert run.returncode == 0, output[-3000:]
    metrics = _results(tmp_path)["metrics"]
    # Ray's own statistics: its decode tasks ran on both nodes.
    assert metrics["ray_nodes"] == 2 and metrics["ray_cpus"] == 2
    assert metrics["ray_nodes_used"] == 2 and metrics["ray_tasks_per_node_min"] >= 1
    assert metrics["ray_tasks"] == 600 // 20
    assert metrics["samples_unique"] == metrics["samples_seen"] == 600
    assert f"the Ray cluster at {address}: 2 node(s), 2 CPUs" in output
    # The job joined the cluster and left it running: both its raylets are still there.
    processes = ray_one_machine.cluster_processes(two_nodes.temp_dir, two_nodes.port)
    raylets = [p for p in processes if p.name() == "raylet"]
    assert len(raylets) == 2, "joining the cluster should leave both its nodes running"
