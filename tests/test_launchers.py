"""Hydra launchers for clusters: their configs compose, and submitit runs a sweep locally."""

from __future__ import annotations

import subprocess
import sys

import mlflow
import pytest
from hydra import compose, initialize_config_dir

from facebench.host.paths import PROJECT_ROOT
from tests.conftest import CONF_DIR


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def test_slurm_launcher_composes_with_gpus_tasks_and_time_limit():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _compose(
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.gpus_per_node=8",
        "hydra.launcher.tasks_per_node=8",
        "hydra.launcher.nodes=2",
        "hydra.launcher.timeout_min=120",
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (8, 8, 2)
    assert launcher.timeout_min == 120


def test_ray_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    cfg = _compose("hydra/launcher=ray", "+hydra.launcher.ray.remote.num_gpus=1")
    assert cfg.hydra.launcher._target_.endswith("RayLauncher")
    assert cfg.hydra.launcher.ray.remote.num_gpus == 1


@pytest.mark.slow
def test_submitit_local_runs_a_two_job_sweep(tmp_path, cache, isolated_env):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=10",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
            "n_workers=0,1",
            "model=none",
            "device=cpu",
            f"data.cache_dir={cache}",
            "data.n_images=120",
            "batch_size=8",
        ],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    mlflow.set_tracking_uri(isolated_env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["facebench"], output_format="list")
    assert sorted(r.info.run_name for r in runs) == [
        "dataset-w0-bs8-loader-only",
        "dataset-w1-bs8-loader-only",
    ]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert len({r.data.tags["sweep_id"] for r in runs}) == 1
