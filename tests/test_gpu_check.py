"""bench/gpu_check.py runs its every step on a CPU (--dry-run), so it cannot rot before a GPU
machine runs it for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from facebench.host.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow
# The steps are the same for every loader: one whose batches the device finishes (uint8) runs
# each of them.
LOADERS = ["raw"]


def test_the_gpu_check_runs_every_step_on_a_cpu(tmp_path, cache, synthetic_root):
    out = tmp_path / "benchmarks.md"
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "bench" / "gpu_check.py"),
            "--dry-run",
            f"--cache-dir={cache}",
            "--n-images=120",
            "--batch-size=8",
            f"--out={out}",
            "--loaders",
            *LOADERS,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert "GPU check (dry run on a CPU" in text and "gpu-marked tests:" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    finished = [row for row in rows[1:] if "did not run" not in row and "FAILED" not in row]
    for mode in ("host only", "loader only, GPU finishes", "ResNet-50 AMP"):
        for loader in LOADERS:
            ran = any(row.startswith(f"| {mode} | {loader} | ") for row in finished)
            assert ran, (mode, loader, result.stderr[-2000:])
    assert any(row.startswith("| compute ceiling | ceiling |") for row in finished)
    # The ceiling becomes a profile any machine can emulate (a dry run's, in its scratch folder).
    [written] = [line for line in text.splitlines() if "accelerator profile written:" in line]
    profile = Path(written.split("written: ")[1].split(" (use it")[0]).read_text()
    assert "\nimages_per_s: " in profile and "name: measured-" in profile
    assert "\nhost_cpu: " in profile and 'host_cpu_source: "measured: ' in profile


def test_a_profile_is_refused_from_anything_but_a_ceiling_on_a_real_device(tmp_path):
    from facebench.errors import FacebenchError
    from facebench.profile import write_profile
    from facebench.results import JobResults

    ceiling = JobResults(
        "ceiling-w5-bs600-fp16",
        {"loader": "ceiling", "model": "resnet50", "amp_resolved": "fp16", "batch_size": 600},
        {"gpu": "NVIDIA H200"},
        metrics={"steady_images_per_s": 25_000.0},
    )
    path = write_profile("h200", ceiling, tmp_path)
    text = path.read_text()
    assert "images_per_s: 25000.0\nmeasured_at: 100\n" in text
    assert "on NVIDIA H200 (resnet50, fp16, batch 600, 100x100)" in text
    ceiling.params["loader"] = "raw"
    with pytest.raises(FacebenchError, match="not a compute ceiling"):
        write_profile("h200", ceiling, tmp_path)
    with pytest.raises(FacebenchError, match="--name Big GPU"):
        write_profile("Big GPU", ceiling, tmp_path)


def test_a_profile_from_a_run_without_a_steady_rate_says_it_takes_the_whole_epoch(tmp_path, caplog):
    # A profile asks for the device's steady pace: a ceiling of 10 batches, 5 workers x 2 made
    # at the start, has none, and the profile says what it took instead.
    import logging

    from facebench.profile import write_profile
    from facebench.results import JobResults

    ceiling = JobResults(
        "ceiling-w5-bs600-fp16",
        {"loader": "ceiling", "model": "resnet50", "n_workers": 5, "loader.prefetch_factor": 2},
        {"gpu": "NVIDIA H200"},
        metrics={"images_per_s": 20_000.0, "batches": 10.0, "warmup_batches": 9.0},
    )
    with caplog.at_level(logging.INFO, logger="facebench"):
        text = write_profile("h200", ceiling, tmp_path).read_text()
    assert "images_per_s: 20000.0\n" in text
    assert (
        "run ceiling-w5-bs600-fp16 has no steady rate (10 batches, too few after its warm-up): "
        "the profile takes its whole epoch's rate, start-up included, below the device's steady "
        "pace. A ceiling run of 15 batches or more gives a steady one"
    ) in caplog.text
