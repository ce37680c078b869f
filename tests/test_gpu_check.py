"""bench/gpu_check.py runs its every step on a CPU (--dry-run), so it cannot rot before a GPU
machine runs it for real."""

from __future__ import annotations

import subprocess
import sys

import pytest

from facebench.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow


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
    loaders = ["dataset", "datapipe", "pickle", "raw", "webdataset", "nodes", "dali", "litdata"]
    for mode in ("host only", "loader only, GPU finishes", "ResNet-50 AMP"):
        for loader in loaders:
            ran = any(row.startswith(f"| {mode} | {loader} | ") for row in finished)
            assert ran, (mode, loader, result.stderr[-2000:])
    assert any(row.startswith("| compute ceiling | ceiling |") for row in finished)
