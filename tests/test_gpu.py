"""Device-side paths: they must deliver what the CPU paths deliver. Skipped without CUDA."""

from __future__ import annotations

import pytest

from facebench import loaders
from tests.helpers import assert_same_samples, delivered, expected, prepared

pytestmark = pytest.mark.gpu
TOLERANCE = 4 / 255 / 0.225


@pytest.mark.parametrize(
    ("name", "options", "atol"),
    [
        ("raw", [], 1e-5),
        ("webdataset", ["loader.device_decode=true"], TOLERANCE),
        ("webdataset", [], TOLERANCE),
        ("nodes", [], TOLERANCE),
        ("litdata", [], 1e-5),
        ("dali", [], TOLERANCE),
    ],
)
def test_device_paths_deliver_the_same_samples(make_cfg, synthetic_root, name, options, atol):
    cfg = make_cfg(
        f"loader={name}",
        "loader.crop=center",
        "shard_size=32",
        "n_workers=2",
        "batch_size=4",
        "device=cuda",
        *options,
    )
    module = loaders.get(name)
    if not module.available():
        pytest.skip(f"loader={name}'s library is not installed")
    module, ctx = prepared(cfg, synthetic_root, "cuda")
    records = ctx.records
    batches = list(module.build(ctx))
    if name == "dali":  # decoded by nvJPEG: already on the GPU
        assert all(batch.images.is_cuda for batch in batches)
    else:  # handed over as a GPU run copies them: from pinned memory, without waiting
        assert all(batch.images.is_pinned() for batch in batches)
    seen = delivered(batches, device="cuda")
    assert len(seen) == len(records)
    assert_same_samples(seen, expected(synthetic_root), atol=atol)


def test_training_step_runs_fp16_with_grad_scaler(make_cfg):
    from facebench.run.runner import run_training

    metrics = run_training(make_cfg("device=cuda", "model=resnet18", "amp=fp16", "n_workers=2"))
    assert metrics["samples_seen"] == 120
    assert "gpu_util_mean" in metrics and "gpu_mem_peak_mb" in metrics
    assert metrics["loss_last"] == metrics["loss_last"]  # not NaN
    # CUDA events around each step: busy and idle add up to the epoch.
    assert 0 < metrics["gpu_busy_frac"] <= 1
    busy = metrics["gpu_busy_s"] + metrics["gpu_idle_s"]
    assert busy == pytest.approx(metrics["epoch_time_s"], rel=1e-6)


@pytest.mark.parametrize("loader", ["raw", "webdataset", "nodes", "dataset", "dali", "litdata"])
def test_host_only_stops_before_the_device(make_cfg, loader):
    from facebench.run.runner import run_training

    metrics = run_training(
        make_cfg(f"loader={loader}", "device=cuda", "host_only=true", "n_workers=2")
    )
    assert metrics["samples_seen"] == 120 and metrics["samples_unique"] == 120
    assert "gpu_busy_frac" not in metrics  # nothing was sent to the device
