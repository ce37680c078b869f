"""Long epochs under a small open-file limit, and workers that die: one line, never a hang."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from facebench.host.paths import PROJECT_ROOT
from tests.helpers import LOADERS, THREADED, workers_up

pytestmark = pytest.mark.slow

BREAK = Path(__file__).with_name("break_workers.py")
# loader=raydata's batches come through Ray's object store, not from worker processes through
# this process's descriptors, and it leaves no multiprocessing folders: what the long-epoch and
# temporary-folder tests guard against is not in it (its bad image: tests/test_bad_data.py).
_OTHERS = [name for name in LOADERS if name != "raydata"]


def _open_files(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


def _sweep(
    loaders: list[str], sweep: Path, env: dict, *overrides: str, **run
) -> tuple[str, int, dict]:
    """One train.py sweep over `loaders`, n_workers=2 and no model or tracking: its output,
    exit status and each job's results.json by loader."""
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "-m",
            f"loader={','.join(loaders)}",
            "n_workers=2",
            "model=none",
            "device=cpu",
            "tracking=false",
            f"hydra.sweep.dir={sweep}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        **run,
    )
    jobs = {}
    for path in sweep.glob("*/results.json"):
        job = json.loads(path.read_text())
        jobs[job["params"]["loader"]] = {**job, "log": (path.parent / "train.log").read_text()}
    return result.stdout + result.stderr, result.returncode, jobs


@pytest.mark.parametrize("loaders", [_OTHERS], ids=["others"])
def test_long_epochs_fit_a_small_open_file_limit(tmp_path, cache, isolated_env, loaders):
    # 600 batches of one image with 2 workers, under a limit of 256 open files: a loop that
    # kept every batch's tensors from the workers (one descriptor each) ran out after about 200.
    output, status, results = _sweep(
        loaders,
        tmp_path / "multirun",
        isolated_env,
        f"data.cache_dir={cache}",
        "data.n_images=600",
        "shards_dir=${data.cache_dir}/long-epochs",
        "shard_size=100",
        "batch_size=1",
        preexec_fn=_open_files(256),
    )
    assert sorted(results) == sorted(loaders), output[-3000:]
    for loader, run in results.items():
        assert run["status"] == "FINISHED", (loader, output[-3000:])
        assert run["metrics"]["batches"] >= 600 - 2, loader  # one partial batch per worker
    assert status == 0, output[-3000:]


# loader=raydata's workers are Ray's: tests/test_raydata.py kills them. Out of descriptors, its
# driver (this process) would wait for Ray without end: Ray opens a connection for each worker
# it leases and each actor it calls as the epoch goes on, and retries one that fails with EMFILE
# forever. It is refused at the next batch instead, as every other loader fails.
@pytest.mark.parametrize(
    ("mode", "loaders"),
    [("kill", _OTHERS), ("files", _OTHERS), ("files", ["raydata"])],
    ids=["kill-others", "files-others", "files-raydata"],
)
def test_broken_workers_end_the_epoch_with_one_line(cache, mode, loaders):
    # A hang would run into the timeout; each loader must instead end with its own line.
    result = subprocess.run(
        [sys.executable, str(BREAK), mode, str(cache), *loaders],
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
    spared = [name for name in loaders if name in (THREADED if mode == "kill" else ["raw"])]
    broken = [loader for loader in loaders if loader not in spared]
    assert named == [f"loader={loader}" for loader in broken], output
    assert all(f"{loader}: no error" in result.stdout for loader in spared)
    for line in lines:
        if mode == "kill":
            assert "died" in line and "n_workers" in line, line
        else:
            assert "ran out of open files" in line and "ulimit -n" in line, line
    assert "Traceback" not in output


# Loaders with worker processes: a thread-based loader's workers end with its process.
@pytest.mark.parametrize("loader", [name for name in LOADERS if name not in THREADED])
def test_no_worker_outlives_a_killed_run(tmp_path, cache, isolated_env, loader):
    process = subprocess.Popen(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            f"loader={loader}",
            f"data.cache_dir={cache}",
            "data.n_images=600",
            "shards_dir=${data.cache_dir}/killed-runs",
            "shard_size=100",
            "batch_size=4",
            "n_workers=2",
            "repeat=1000",
            "model=none",
            "device=cpu",
            "tracking=false",
            f"hydra.run.dir={tmp_path / 'out'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=isolated_env,
    )
    deadline = time.monotonic() + 120
    for line in process.stdout:  # the runner's line just before the first epoch
        if f"loader={loader}, model=none" in line or time.monotonic() > deadline:
            break
    workers = workers_up(process, 2, deadline)
    assert process.poll() is None, "the run ended before it could be killed"
    process.kill()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    # A zombie has ended: it runs nothing and holds no memory, and waits only for whoever
    # adopted it (the container's init, which may never ask) to read its exit status.
    running = [worker for worker in alive if not _ended(worker)]
    for survivor in running:
        survivor.kill()  # they hold the output pipe open
    process.communicate(timeout=60)
    assert not running, f"loader={loader}: {len(running)} worker processes outlived a killed run"


def _ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("loaders", [_OTHERS], ids=["others"])
def test_a_failed_run_leaves_no_temporary_folders(tmp_path, isolated_env, request, loaders):
    """A run that fails on a bad image leaves none of its workers' socket folders in /tmp:
    every loader but raydata (_OTHERS) in turn, in one sweep (a failed job does not stop the
    next)."""
    from tests.conftest import write_tree

    root = write_tree(tmp_path / "data", {f"{i:06d}.jpg": 1 + i % 3 for i in range(1, 9)}, {0: 30})
    (root / "DigiFace1M" / "0" / "17.png").write_text("not a PNG")
    # A short path: a socket's path in it must fit AF_UNIX's 108 bytes, and pytest's own temporary
    # folders run long (one per pytest-xdist worker, then one per test).
    temporary = Path(tempfile.mkdtemp(prefix="fb-"))
    request.addfinalizer(lambda: shutil.rmtree(temporary, ignore_errors=True))
    output, status, jobs = _sweep(
        loaders,
        tmp_path / "multirun",
        {**isolated_env, "TMPDIR": str(temporary)},
        "data=celeba_digiface",
        f"data.root={root}",
        f"shards_dir={tmp_path / 'shards'}",
        "shard_size=8",
        "batch_size=2",
    )
    assert status == 1, output[-3000:]
    assert {loader: job["status"] for loader, job in jobs.items()} == dict.fromkeys(
        loaders, "FAILED"
    ), output[-3000:]
    for loader, job in jobs.items():
        assert "17.png" in job["log"] and "cannot decode this image" in job["log"], loader
    left = sorted(path.name for path in temporary.glob("pymp-*"))
    assert not left, f"temporary folders left behind: {left}"
