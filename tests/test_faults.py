"""Interrupted builds, interrupted runs, a broken tracking store, and random damage."""

from __future__ import annotations

import errno
import logging
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import psutil
import pytest

from facebench import loaders
from facebench.data.sources import read_records
from facebench.errors import FacebenchError, ShardError
from facebench.host.paths import PROJECT_ROOT
from facebench.host.ports import free_port
from facebench.loaders.shardsets import trusted_manifest
from facebench.shards import room
from facebench.shards.build import ensure_shards
from facebench.shards.manifest import Manifest
from tests.helpers import HOLD_LOCK, context, delivered, prepared, workers_up

pytestmark = pytest.mark.slow


def _prepare(tmp_path, cache, env, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(PROJECT_ROOT / "prepare.py"),
            f"data.cache_dir={cache}",
            "data.n_images=120",
            f"shards_dir={tmp_path / 'shards'}",
            "shard_size=4",
            "n_workers=1",
            f"hydra.run.dir={tmp_path / 'prepare'}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("shard_format", ["pickle", "raw"])
def test_killed_prepare_is_refused_then_finished(
    tmp_path, cache, synthetic_root, isolated_env, make_cfg, prepare_here, shard_format
):
    folder = tmp_path / "shards" / shard_format
    cfg = make_cfg(
        f"loader={'pickle' if shard_format == 'pickle' else 'raw'}",
        f"shards_dir={tmp_path / 'shards'}",
        "n_workers=0",
        "batch_size=4",
    )
    module, ctx = loaders.get(cfg.loader.name), context(cfg, synthetic_root)
    # Kill points: after a random number of shards, rising, so every build gets further.
    rng = random.Random(shard_format)
    targets = sorted(rng.sample(range(1, 29), 3))  # of 30 shards
    resumed = False
    for target in targets:
        process = _prepare(tmp_path, cache, isolated_env, f"format={shard_format}")
        deadline = time.monotonic() + 120
        while len(list(folder.glob(".done/*.json"))) < target:
            assert process.poll() is None, "prepare.py ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)
        output = process.communicate()[0]
        resumed |= "already done" in output
        assert Manifest.read(folder) is None
        with pytest.raises(ShardError, match="no complete shard set"):
            trusted_manifest(ctx)
    # The build that finishes runs in this process (only the killed ones need their own).
    output = prepare_here(
        f"shards_dir={tmp_path / 'shards'}", "shard_size=4", "n_workers=1", f"format={shard_format}"
    )
    resumed |= "already done" in output
    assert "nothing to do" not in output
    assert resumed, "no build reused the shards an earlier, killed build had finished"
    manifest = trusted_manifest(ctx)
    assert sum(shard.samples for shard in manifest.shards) == 120
    seen = delivered(module.build(ctx))
    assert sorted(seen) == list(range(120))
    assert not list(folder.glob(".*tmp*"))  # no half-written files left behind


@pytest.mark.parametrize(
    ("signal_name", "code", "loader"),
    [("SIGINT", 130, "dataset"), ("SIGINT", 130, "nodes"), ("SIGTERM", 143, "nodes")],
)
def test_a_stopped_run_ends_killed_in_one_line_and_stops_workers(
    tmp_path, cache, isolated_env, signal_name, code, loader
):
    marker = f"hydra.run.dir={tmp_path / 'out'}"
    process = subprocess.Popen(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            f"loader={loader}",
            f"data.cache_dir={cache}",
            "data.n_images=120",
            "model=resnet18",
            "amp=off",
            "batch_size=8",
            "n_workers=2",
            "repeat=50",
            "device=cpu",
            marker,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=isolated_env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal gives a command
    )
    deadline = time.monotonic() + 120
    lines = []
    for line in process.stdout:  # the runner's line just before the first epoch
        lines.append(line)
        if f"loader={loader}, model=resnet18" in line or time.monotonic() > deadline:
            break
    workers = workers_up(process, 2, deadline)  # its first batches are in the model
    # As a terminal's Ctrl-C (or a scheduler's SIGTERM) does: to every process of the group.
    os.killpg(process.pid, getattr(signal, signal_name))
    output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == code, output[-3000:]
    said = (
        f"interrupted by {signal_name}: run {loader}-w2-bs8-fp32-resnet18 marked KILLED in MLflow"
    )
    assert f"{said}; shards built so far are kept" in output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    mlflow.set_tracking_uri(isolated_env["MLFLOW_TRACKING_URI"])
    [run] = mlflow.search_runs(experiment_names=["facebench"], output_format="list")
    assert run.info.status == "KILLED"
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, "worker processes outlived the run"


def test_a_build_waiting_for_a_lock_stops_in_one_line(tmp_path, cache, isolated_env):
    folder = tmp_path / "shards" / "raw"
    folder.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        process = _prepare(tmp_path, cache, isolated_env, "format=raw")
        for line in process.stdout:
            if "waiting for process" in line:
                break
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    finally:
        holder.kill()
    assert process.returncode == 143, output[-3000:]
    assert f"interrupted by SIGTERM: shards finished so far in {folder} are kept" in output
    assert "Traceback" not in output and "BlockingIOError" not in output


def _read_only_folder(folder: Path) -> bool:
    """Make folder read-only: by its mode, or (for root, whom modes do not stop) by mounting an
    empty read-only file system on it."""
    folder.mkdir()
    folder.chmod(0o555)
    if not os.access(folder, os.W_OK):
        return True
    mount = ["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)]
    return subprocess.run(mount, capture_output=True).returncode == 0


@pytest.mark.parametrize("where", ["/proc", "read-only"])
def test_a_store_that_cannot_be_written_is_reported_within_seconds(tmp_path, monkeypatch, where):
    # MLflow retried such a store for about two minutes before it said anything.
    from facebench.errors import TrackingError
    from facebench.tracking.tracker import Tracker

    folder = Path("/proc") if where == "/proc" else tmp_path / "store"
    if where == "read-only" and not _read_only_folder(folder):
        pytest.skip("no read-only folder can be made here")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder}/mlflow.db")
    started = time.monotonic()
    try:
        with (
            pytest.raises(TrackingError, match="cannot be written.*tracking=false"),
            Tracker().run("probe", {}, {}),
        ):
            pass
    finally:
        if where == "read-only":
            subprocess.run(["umount", str(folder)], capture_output=True)
    assert time.monotonic() - started < 10


def test_an_unreachable_tracking_server_fails_within_seconds(tmp_path, cache, isolated_env):
    port = free_port()  # a port on this machine that nothing listens on
    env = dict(isolated_env, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}")
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            f"data.cache_dir={cache}",
            "data.n_images=120",
            "model=none",
            "batch_size=8",
            "device=cpu",
            f"hydra.run.dir={tmp_path / 'out'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # MLflow's own retries took over four minutes
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert f"MLflow server http://127.0.0.1:{port} does not answer" in output
    assert "tracking=false" in output and "Traceback" not in output


def test_random_damage_never_passes_silently(tmp_path, synthetic_root, make_cfg):
    """Seeded random corruption of label files, images and shards: every outcome is either a
    correct result or a FacebenchError naming what is wrong, never a wrong label."""
    rng = np.random.default_rng(7)
    truth = {
        Path(r.path).relative_to(synthetic_root): r.label for r in read_records(synthetic_root)[0]
    }
    for trial in range(12):
        root = tmp_path / f"t{trial}"
        shutil.copytree(synthetic_root, root, ignore=shutil.ignore_patterns("facebench-shards"))
        labels_file = root / "CelebA" / "identity_CelebA.txt"
        kind = trial % 3
        if kind == 0:  # damage the label file: flip, drop or insert characters
            text = bytearray(labels_file.read_bytes())
            for _ in range(3):
                at = int(rng.integers(len(text)))
                text[at : at + 1] = bytes([int(rng.choice(list(b" \n\r\t0123456789x.-")))])
            labels_file.write_bytes(bytes(text))
        elif kind == 1:  # damage image bytes
            for path in rng.choice(sorted(root.rglob("*.[jp][pn]g")), 3, replace=False):
                data = bytearray(Path(path).read_bytes())
                start = int(rng.integers(len(data)))
                data[start : start + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
                Path(path).write_bytes(bytes(data[: int(rng.integers(1, len(data) + 1))]))
        for loader in ("dataset", "webdataset", "raw"):
            cfg = make_cfg(
                "data=celeba_digiface",
                f"data.root={root}",
                f"loader={loader}",
                "loader.crop=center",
                "shard_size=40",
                "batch_size=4",
            )
            try:
                module, ctx = prepared(cfg, root)
                if kind == 2 and module.shard_format is not None:  # damage a built shard
                    shard = sorted(
                        p
                        for p in ctx.shards_dir.glob("shard-*")
                        if not p.name.endswith("index.npy")
                    )[0]
                    data = bytearray(shard.read_bytes())
                    at = int(rng.integers(len(data) - 64))
                    data[at : at + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
                    shard.write_bytes(bytes(data))
                seen = delivered(module.build(ctx))
            except FacebenchError as error:
                assert str(error), "an error with no explanation"
                continue
            for sample_id, (_, label) in seen.items():
                record = ctx.records[sample_id]
                # What the (possibly damaged) label file says is what must arrive; where the
                # label file is intact, that is the true label.
                assert label == record.label
                if kind != 0:
                    assert label == truth[Path(record.path).relative_to(root)]


def test_a_set_that_cannot_fit_is_refused_before_anything_is_written(
    tmp_path, synthetic_root, monkeypatch
):
    folder = tmp_path / "shards"
    monkeypatch.setattr(room, "free_bytes", lambda _: 1_000_000)
    with pytest.raises(ShardError, match="not enough disk space") as raised:
        # 120 samples of 112x112x3 bytes: 4.5 MB, where 1 MB is free.
        ensure_shards(synthetic_root, folder, "raw", seed=1, shard_size=40)
    message = str(raised.value)
    assert str(folder) in message and "needs about 4.5 MB and 1.0 MB are free" in message
    assert "shards_dir=" in message
    assert [p.name for p in folder.iterdir()] == [".lock"]  # nothing written


def test_a_full_disk_mid_build_leaves_no_temporaries_and_resumes(
    tmp_path, synthetic_root, monkeypatch, caplog
):
    folder = tmp_path / "shards"
    real_fsync = os.fsync

    def full_at_the_fourth_shard(fd: int) -> None:
        if "shard-00003" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    # Forked shard writers (n_procs=2) inherit the patch: the disk "fills" in one of them.
    monkeypatch.setattr(os, "fsync", full_at_the_fourth_shard)
    with pytest.raises(ShardError, match="the disk is full") as raised:
        ensure_shards(synthetic_root, folder, "pickle", shard_size=20, n_procs=2)
    message = str(raised.value)
    assert str(folder) in message and "finished shards are kept" in message
    leftovers = [p.name for p in folder.rglob("*") if ".tmp-" in p.name]
    assert leftovers == [], "half-written files left to keep the disk full"
    assert Manifest.read(folder) is None
    monkeypatch.setattr(os, "fsync", real_fsync)
    with caplog.at_level(logging.INFO):
        shard_set = ensure_shards(synthetic_root, folder, "pickle", shard_size=20, n_procs=2)
    assert "already done" in caplog.text  # the finished shards were reused
    assert shard_set.manifest.n_samples == 120


def test_prepare_on_a_small_disk_says_how_much_it_needs(tmp_path, cache, isolated_env):
    disk = tmp_path / "disk"
    disk.mkdir()
    prepare = [
        sys.executable,
        str(PROJECT_ROOT / "prepare.py"),
        f"data.cache_dir={cache}",
        "data.n_images=120",
        "format=raw",
        f"shards_dir={disk}",
        f"hydra.run.dir={tmp_path / 'out'}",
    ]
    # A 1 MB filesystem of its own, in a private mount namespace (needs root, as CI has).
    script = f"mount -t tmpfs -o size=1m tmpfs {disk} && exec {shlex.join(prepare)}"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {disk}"],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip("cannot mount a small filesystem here (needs root and unshare)")
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"{disk}/raw: not enough disk space for the shards" in output
    assert "Traceback" not in output
