"""Long epochs under a small open-file limit, and workers that die: one line, never a hang."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from facebench.paths import PROJECT_ROOT
from tests.helpers import LOADERS, THREADED

pytestmark = pytest.mark.slow

BREAK = Path(__file__).with_name("break_workers.py")


def _open_files(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


def test_long_epochs_fit_a_small_open_file_limit(tmp_path, cache, isolated_env):
    # 600 batches of one image with 2 workers, under a limit of 256 open files: a loop that
    # kept every batch's tensors from the workers (one descriptor each) ran out after about 200.
    sweep = tmp_path / "multirun"
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "-m",
            f"loader={','.join(LOADERS)}",
            f"data.cache_dir={cache}",
            "data.n_images=600",
            "shards_dir=${data.cache_dir}/long-epochs",
            "shard_size=100",
            "batch_size=1",
            "n_workers=2",
            "model=none",
            "device=cpu",
            "tracking=false",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=600,
        preexec_fn=_open_files(256),
    )
    output = result.stdout + result.stderr
    results = {}
    for path in sweep.glob("*/results.json"):
        run = json.loads(path.read_text())
        results[run["params"]["loader"]] = run
    assert sorted(results) == sorted(LOADERS), output[-3000:]
    for loader, run in results.items():
        assert run["status"] == "FINISHED", (loader, output[-3000:])
        assert run["metrics"]["batches"] >= 600 - 2, loader  # one partial batch per worker
    assert result.returncode == 0, output[-3000:]


@pytest.mark.parametrize("mode", ["kill", "files"])
def test_broken_workers_end_the_epoch_with_one_line(cache, mode):
    # A hang would run into the timeout; each loader must instead end with its own line.
    result = subprocess.run(
        [sys.executable, str(BREAK), mode, str(cache), *LOADERS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("LoaderFailure")]
    named = [line.split(":")[1].strip() for line in lines]
    # raw's and dali's workers are threads of the loop's own process: no process to kill, no
    # descriptor passed between processes. dali still opens each image file as it reads it, so
    # a lowered limit stops it too; raw opened its shards before the first batch.
    spared = THREADED if mode == "kill" else ["raw"]
    broken = [loader for loader in LOADERS if loader not in spared]
    assert named == [f"loader={loader}" for loader in broken], output
    assert all(f"{loader}: no error" in result.stdout for loader in spared)
    for line in lines:
        if mode == "kill":
            assert "died" in line and "n_workers" in line, line
        else:
            assert "ran out of open files" in line and "ulimit -n" in line, line
    assert "Traceback" not in output
