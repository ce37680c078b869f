"""Emulated accelerators: AU means what MLPerf Storage's means, and a host's count adds up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from facebench.accelerator import Accelerator, EmulatedSteps
from facebench.config import AcceleratorConfig
from facebench.errors import ConfigError
from facebench.paths import PROJECT_ROOT
from facebench.runner import run_training


def test_published_rates_are_scaled_to_the_runs_crop_by_pixel_count():
    h100 = AcceleratorConfig("h100", step_s=0.224, step_batch=400, measured_at=224)
    at_100 = Accelerator.of(h100, crop=100, batch_size=600)
    assert at_100.images_per_s == pytest.approx(400 / 0.224 * 5.0176)
    assert at_100.scaled_from == 224
    at_224 = Accelerator.of(h100, crop=224, batch_size=600)
    assert at_224.images_per_s == pytest.approx(400 / 0.224) and at_224.scaled_from == 0
    own = Accelerator.of(AcceleratorConfig("custom", images_per_s=5000), 100, 600)
    assert own.images_per_s == 5000 and own.scaled_from == 0
    by_step = Accelerator.of(AcceleratorConfig("custom", step_s=0.1), 100, 600)
    assert by_step.images_per_s == pytest.approx(6000)  # batch_size images a step
    assert Accelerator.of(AcceleratorConfig(), 100, 600) is None
    with pytest.raises(ConfigError, match="accelerator=custom: give its rate"):
        Accelerator.of(AcceleratorConfig("custom"), 100, 600)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_au_leaves_the_first_step_out_and_counts_only_the_steps():
    """DLIO's definition: compute time over the time from the first step's end, that step
    left out of both."""
    clock = _Clock()
    steps = EmulatedSteps(
        Accelerator("x", images_per_s=100.0, min_au=0.9, source=""), clock=clock, sleep=clock.sleep
    )
    clock.now = 5.0  # the workers' start-up: the first batch came late
    for _ in range(4):
        steps.step(10)  # 0.1 s each
        clock.now += 0.1  # then the wait for the next batch
    metrics = steps.metrics(epoch_end=clock.now)
    assert metrics["au"] == pytest.approx(0.3 / 0.7)  # 3 steps in the 0.7 s after the first
    assert metrics["au_pass"] == 0.0
    assert metrics["accelerator_compute_s"] == pytest.approx(0.4)
    assert EmulatedSteps(steps.accelerator).metrics(1.0) == {}  # no step: nothing to say


@pytest.mark.parametrize("rate", [2000, 8960])
def test_the_compute_ceiling_keeps_any_accelerator_busy(make_cfg, rate):
    metrics = run_training(
        make_cfg(
            "loader=ceiling",
            "accelerator=custom",
            f"accelerator.images_per_s={rate}",
            "data.n_images=1200",
            "batch_size=120",
        )
    )
    assert metrics["au"] >= 0.99
    assert metrics["au_pass"] == 1.0


def _host_rate(make_cfg, *overrides: str) -> float:
    metrics = run_training(make_cfg(*overrides, "host_only=true"))
    return metrics["steady_images_per_s"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "loader",
    [("loader=dataset",), ("loader=nodes", "loader.method=thread")],
    ids=["processes", "threads"],
)
@pytest.mark.parametrize(("times", "expected"), [(0.25, 1.0), (4.0, 0.25)])
def test_au_follows_how_fast_the_loader_feeds(make_cfg, loader, times, expected):
    """An accelerator 4x slower than the loader's host side (R) is kept busy (AU near 1); one
    4x faster, a quarter of the time: AU within 10% of min(1, R / rate). Each trial measures R
    just before its emulated run, and the median of three is held to it: a machine's load
    moves from one second to the next, and R with it."""
    # One worker: the core the loop leaves idle while it waits for the accelerator would
    # otherwise speed the workers up beside the host-only measurement.
    overrides = (*loader, "n_workers=1", "data.n_images=2400", "batch_size=40")
    ratios = []
    for _ in range(3):
        host = _host_rate(make_cfg, *overrides)
        rate = host * times
        metrics = run_training(
            make_cfg(*overrides, "accelerator=custom", f"accelerator.images_per_s={rate}")
        )
        ratios.append(metrics["au"] / min(1.0, host / rate))
    assert sorted(ratios)[1] == pytest.approx(1.0, rel=0.10), ratios


@pytest.mark.slow
def test_n_accelerators_a_host_feeds_n_times_over_add_up(tmp_path, cache, isolated_env):
    """Two emulated accelerators, one process each (started by torchrun's launcher): their
    images/s add up, and each takes its share of the epoch."""
    rate = 1000.0
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "loader=raw",
            "n_workers=1",
            f"data.cache_dir={cache}",
            "data.n_images=2400",
            "batch_size=40",
            "accelerator=custom",
            f"accelerator.images_per_s={rate}",
            "accelerators_per_host=2",
            "tracking=false",
            "device=cpu",
            f"hydra.run.dir={tmp_path / 'out'}",
        ],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    job = json.loads((tmp_path / "out" / "results.json").read_text())
    metrics = job["metrics"]
    assert job["run_name"] == "raw-w1-bs40-custom-x2" and metrics["world_size"] == 2
    assert metrics["steady_images_per_s"] == pytest.approx(2 * rate, rel=0.10)
    assert metrics["au"] >= 0.9 and metrics["au_min"] >= 0.9 and metrics["au_pass"] == 1.0
    assert metrics["samples_unique"] == metrics["samples_seen"] == 2400
