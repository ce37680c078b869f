"""Two ranks (gloo, CPU) under torchrun: every loader splits each epoch without gaps or repeats."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest

from facebench.host.distributed import whole_job
from facebench.host.paths import PROJECT_ROOT
from tests.helpers import in_two_sweeps

pytestmark = pytest.mark.slow


N_IMAGES, BATCH = 24, 4  # three batches a rank: enough to split, few enough to train fast


@in_two_sweeps()
def test_every_loader_splits_the_epoch_across_two_ranks(tmp_path, cache, isolated_env, loaders):
    sweep = tmp_path / "multirun"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(PROJECT_ROOT / "train.py"),
            "-m",
            f"loader={','.join(loaders)}",
            f"data.cache_dir={cache}",
            f"data.n_images={N_IMAGES}",
            "shards_dir=${data.cache_dir}/ddp",
            "shard_size=6",
            f"batch_size={BATCH}",
            "n_workers=1",
            # DDP's gradients once, in the others' sweep; Ray's case, which starts a Ray of
            # its own in each rank, is about its split alone.
            "model=none" if loaders == ["raydata"] else "model=resnet18",
            "amp=off",  # bf16 on a CPU without bf16 instructions is ten times slower
            "device=cpu",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    assert sorted(r["params"]["loader"] for r in results) == sorted(loaders)
    for run in results:
        metrics, loader = run["metrics"], run["params"]["loader"]
        assert run["status"] == "FINISHED", loader
        assert run["params"]["world_size"] == 2 and run["run_name"].endswith("-x2")
        # The union over both ranks and their workers: no repeats, nothing beyond the data,
        # and (the check inside each run) nothing lost but drop_last's remainders.
        assert metrics["samples_unique"] == metrics["samples_seen"], loader
        # Each rank's one worker may drop a remainder of less than a batch.
        assert N_IMAGES - 2 * (BATCH - 1) <= metrics["samples_seen"] <= N_IMAGES, loader
        assert metrics["world_size"] == 2
        assert metrics["data_wait_s_max"] >= metrics["data_wait_s"]
    # Rank 0 alone records: one MLflow run per job, with the whole job's metrics.
    mlflow.set_tracking_uri(isolated_env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["facebench"], output_format="list")
    assert sorted(r.data.params["loader"] for r in runs) == sorted(loaders)
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.params["world_size"] == "2"
        assert run.data.metrics["world_size"] == 2
        assert run.data.metrics["samples_unique"] == run.data.metrics["samples_seen"]


def test_whole_job_metrics_sum_counts_and_take_the_slowest_rank():
    ranks = [
        {
            "samples_seen": 80.0,
            "batches": 10.0,
            "epoch_time_s": 2.0,
            "time_to_first_batch_s": 0.5,
            "steady_images_per_s": 50.0,
            "data_wait_s": 1.0,
            "data_wait_frac": 0.5,
            "compute_s": 1.0,
            "cpu_util_mean": 40.0,
            "stage_decode_us": 500.0,
        },
        {
            "samples_seen": 80.0,
            "batches": 10.0,
            "epoch_time_s": 4.0,
            "time_to_first_batch_s": 0.2,
            "steady_images_per_s": 30.0,
            "data_wait_s": 3.0,
            "data_wait_frac": 0.75,
            "compute_s": 1.0,
            "cpu_util_mean": 60.0,
            "stage_decode_us": 700.0,
        },
    ]
    merged = whole_job(ranks)
    assert merged["samples_seen"] == 160 and merged["epoch_time_s"] == 4.0
    assert merged["images_per_s"] == 40.0
    assert merged["data_wait_s"] == 2.0 and merged["data_wait_s_max"] == 3.0
    assert merged["time_to_first_batch_s"] == 0.5
    assert merged["stage_decode_us"] == 600.0  # per image: the ranks' mean
    assert "au" not in merged  # no emulated accelerator, no AU

    emulated = [
        {**ranks[0], "au": 0.96, "accelerator_compute_s": 1.9, "accelerator_steps": 10.0},
        {**ranks[1], "au": 0.84, "accelerator_compute_s": 3.4, "accelerator_steps": 9.0},
    ]
    merged = whole_job(emulated)
    # DLIO's figures: the mean AU over accelerators, and the lowest; their compute time summed.
    assert merged["au"] == pytest.approx(0.90) and merged["au_min"] == 0.84
    assert merged["accelerator_compute_s"] == pytest.approx(5.3)
    assert merged["accelerator_steps"] == 9.0
    # A rank with too few steps for an AU: rank 0's alone must not pose as the job's.
    del emulated[1]["au"]
    assert "au" not in whole_job(emulated)
