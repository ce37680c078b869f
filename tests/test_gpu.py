"""Device-side paths: they must deliver what the CPU paths deliver. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from facebench import loaders
from facebench.data.sources import read_records
from facebench.runner import before_epoch, loader_context
from tests.helpers import assert_same_samples, delivered, expected

pytestmark = pytest.mark.gpu
TOLERANCE = 4 / 255 / 0.225


@pytest.mark.parametrize(
    ("name", "options", "atol"),
    [
        ("raw", [], 1e-5),
        ("webdataset", ["loader.device_decode=true"], TOLERANCE),
        ("webdataset", [], TOLERANCE),
        ("nodes", [], TOLERANCE),
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
    records, labels = read_records(synthetic_root)
    module = loaders.get(name)
    ctx = loader_context(cfg, module, synthetic_root, records, labels, torch.device("cuda"))
    before_epoch(module, ctx)
    batches = list(module.build(ctx))
    assert all(images.device.type == "cuda" for images, _, _ in batches)
    seen = delivered(batches)
    assert len(seen) == len(records)
    assert_same_samples(seen, expected(synthetic_root), atol=atol)


def test_training_step_runs_fp16_with_grad_scaler(make_cfg):
    from facebench.runner import run_training

    metrics = run_training(make_cfg("device=cuda", "model=resnet18", "amp=fp16", "n_workers=2"))
    assert metrics["samples_seen"] == 120
    assert "gpu_util_mean" in metrics and "gpu_mem_peak_mb" in metrics
    assert metrics["loss_last"] == metrics["loss_last"]  # not NaN
