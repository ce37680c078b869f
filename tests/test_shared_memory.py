"""A small /dev/shm (Docker's default 64 MB): every loader refused up front in one line, or run;
a run that meets the limit anyway ends in one line; none hangs. Real runs in a private mount
namespace with a small tmpfs on /dev/shm, where `unshare -m` is permitted."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from facebench import loaders, shared_memory
from facebench.config import Workers
from facebench.errors import ConfigError
from facebench.finish import AHEAD, batches_held
from facebench.loaders.spec import Handover
from facebench.paths import PROJECT_ROOT
from facebench.shared_memory import MIB, InFlight, Space
from tests.helpers import LOADERS, TRAITS

FILL = Path(__file__).with_name("fill_shm.py")
INSTALLED = [name for name in LOADERS if loaders.get(name).available()]
PROCESS = [name for name in INSTALLED if TRAITS[name].workers == Workers.process]
# Batch 600 of the default set, two workers, loader only on the CPU: as the issue ran them.
RUN = ["model=none", "n_workers=2", "batch_size=600", "data.n_images=6000", "device=cpu"]


def expected_need(name: str) -> int:
    """What `name`'s two workers have in shared memory at once with RUN's settings, the obvious
    way: 2 x prefetch_factor 2 ready batches, the one the loop holds, the two a CPU loop
    finishes ahead, and those the pipeline keeps received (nodes' Prefetcher: 2)."""
    spec = loaders.get(name)
    traits = spec.traits_for()
    image = 4 * 3 * 100 * 100 if traits.handover == Handover.normalized else 112 * 112 * 3
    received = 2 if spec.received_ahead is not None else 0
    return (2 * 2 + 1 + AHEAD + received) * 600 * image


def test_the_refusal_names_both_sizes_and_what_fits(monkeypatch):
    batch = InFlight("dataset", 2, 2, 3, 600, 4 * 3 * 100 * 100, "float32 3x100x100")
    assert (batch.batches, batch.need) == (7, 7 * 600 * 120_000)
    monkeypatch.setattr(shared_memory, "space", lambda: Space(Path("/dev/shm"), 64 * MIB, 60 * MIB))
    with pytest.raises(ConfigError) as raised:
        shared_memory.check(batch, ["raw", "dali"])
    assert str(raised.value) == (
        "loader=dataset: its 2 worker processes hand batches over through shared memory, up to 7 "
        "batches of 600 images (float32 3x100x100, 68.7 MiB each) at once: about 480.7 MiB, but "
        "/dev/shm has 60.0 MiB free (of 64.0 MiB). Give it more: docker run --shm-size=640m (a "
        "Kubernetes pod: an emptyDir with medium: Memory mounted at /dev/shm), or batch_size=74 "
        "or smaller, or workers that are threads (loader=raw, loader=dali); resource_check=false "
        "starts it anyway"
    )
    # 74 images a batch do fit; with room for 6 batches of 600, fewer workers and a shallower
    # prefetch are named too.
    assert batch.__class__(**{**batch.__dict__, "batch_size": 74}).fits(
        Space(Path("/dev/shm"), 64 * MIB, 60 * MIB)
    )
    roomy = Space(Path("/dev/shm"), 500 * MIB, 420 * MIB)
    three = InFlight("nodes", 3, 2, 3, 600, 120_000, "x", thread_option="loader.method=thread")
    said = shared_memory.remedies(three, roomy, ["raw"])
    assert "n_workers=1" in said and "loader.prefetch_factor=1" in said
    assert "workers that are threads (loader.method=thread, loader=raw)" in said
    # Ranks on one machine share its /dev/shm.
    ranks = InFlight("raw", 2, 2, 1, 600, 120_000, "x", ranks=4)
    assert ranks.need == 4 * 5 * 600 * 120_000
    assert ranks.describe().endswith("at once per rank: about 1,373.3 MiB in all")
    shared_memory.check(batch, [], enabled=False)  # resource_check=false: no refusal
    shared_memory.check(None, [])  # a loader without worker processes: nothing to check


@pytest.mark.parametrize("name", INSTALLED)
def test_every_loader_says_what_its_workers_hold(name, make_cfg, synthetic_root):
    from tests.helpers import context

    cfg = make_cfg(f"loader={name}", "n_workers=2", "batch_size=600")
    ctx, spec = context(cfg, synthetic_root), loaders.get(name)
    on_cpu = loaders.in_flight(name, spec, ctx, batches_held(ctx.device, host_only=False))
    if name not in PROCESS:
        assert on_cpu is None  # threads of the loop's own process share its memory
        return
    assert on_cpu.need == expected_need(name)
    # A GPU run's host side (and host_only, and an emulated accelerator) finishes nothing ahead.
    host_side = loaders.in_flight(name, spec, ctx, batches_held(torch.device("cuda"), False))
    assert host_side.batches == on_cpu.batches - AHEAD
    assert batches_held(ctx.device, host_only=True) == 1


def unshare_permitted() -> str:
    """Why a private mount namespace with its own /dev/shm cannot be made here, or ''."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
        text=True,
    )
    return probe.stderr.strip() or f"exit status {probe.returncode}" if probe.returncode else ""


def in_small_shm(size: str, command: list[str], env: dict, timeout: int) -> tuple[str, int]:
    """command run with a /dev/shm of `size` of its own; its output and exit status."""
    reason = unshare_permitted()
    if reason:
        pytest.skip(f"cannot give a process its own /dev/shm (unshare -m): {reason}")
    mount = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, "sh", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,  # a hang fails the test here
    )
    return result.stdout + result.stderr, result.returncode


def sweep(tmp_path: Path, cache: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        str(PROJECT_ROOT / "train.py"),
        "-m",
        f"loader={','.join(INSTALLED)}",
        *RUN,
        f"data.cache_dir={cache}",
        "tracking=false",
        f"hydra.sweep.dir={tmp_path}",
        *overrides,
    ]


def finished(tmp_path: Path) -> dict[str, dict]:
    jobs = {}
    for path in tmp_path.glob("*/results.json"):
        job = json.loads(path.read_text())
        jobs[job["params"]["loader"]] = job
    return jobs


def errors(output: str) -> dict[str, str]:
    """Each failed job's one ERROR line, by loader."""
    lines = [line for line in output.splitlines() if "[ERROR]" in line and "loader=" in line]
    return {re.search(r"loader=(\w+)", line).group(1): line for line in lines}


@pytest.mark.slow
def test_in_48_mb_every_loader_is_refused_in_one_line_or_runs(tmp_path, cache, isolated_env):
    output, status = in_small_shm("48m", sweep(tmp_path, cache), isolated_env, timeout=400)
    refused, jobs = errors(output), finished(tmp_path)
    assert "Traceback" not in output
    assert sorted(refused) == PROCESS, output[-3000:]
    for name, line in refused.items():
        need = float(re.search(r"at once: about ([\d,.]+) MiB", line).group(1).replace(",", ""))
        assert need == pytest.approx(expected_need(name) / MIB, abs=0.05), line
        # Nearly all of it free (a shard build just before may leave a semaphore or two).
        free = re.search(r"but /dev/shm has ([\d.]+) MiB free \(of 48.0 MiB\)", line).group(1)
        assert 47 < float(free) <= 48, line
        assert "docker run --shm-size=" in line and "resource_check=false" in line
    for name in set(INSTALLED) - set(PROCESS):  # threads: no shared memory to run out of
        assert jobs[name]["status"] == "FINISHED" and jobs[name]["metrics"]["samples_seen"] == 6000
    assert status == 1


@pytest.mark.slow
def test_past_the_check_running_out_ends_in_one_line(tmp_path, cache, isolated_env):
    overrides = ("resource_check=false",)
    command = sweep(tmp_path, cache, *overrides, f"loader={','.join(PROCESS)}")
    output, status = in_small_shm("48m", command, isolated_env, timeout=400)
    failed = errors(output)
    assert "Traceback" not in output
    assert sorted(failed) == PROCESS, output[-3000:]
    for line in failed.values():
        assert "its workers ran out of shared memory for a batch: /dev/shm holds 48.0 MiB" in line
        assert "docker run --shm-size=" in line
    assert status == 1


@pytest.mark.slow
def test_shared_memory_filled_by_another_process_ends_in_one_line(tmp_path, cache, isolated_env):
    # torchdata.nodes: its workers' queues once dropped a batch they could not put in shared
    # memory, and the loop waited for it forever. (DataLoader's workers fail in their collate,
    # which the sweep above covers.)
    name = "nodes"
    command = [
        sys.executable,
        str(FILL),
        f"loader={name}",
        *RUN,
        f"data.cache_dir={cache}",
        "tracking=false",
        f"hydra.run.dir={tmp_path}",
    ]
    output, status = in_small_shm("1g", command, isolated_env, timeout=300)
    [line] = [line for line in output.splitlines() if "[ERROR]" in line]
    assert status == 1 and "Traceback" not in output
    assert f"loader={name}: its workers ran out of shared memory for a batch: /dev/shm " in line
    assert "so another process filled it (`ls -la /dev/shm` shows what is there)" in line
    assert "Free it, or give it more" in line


@pytest.mark.slow
def test_advise_skips_what_shared_memory_cannot_hold_and_says_why(tmp_path, cache, isolated_env):
    out = tmp_path / "advice"
    command = [
        sys.executable,
        "-m",
        "facebench.advise",
        "accelerator=h100",
        "loaders=[dataset,raw]",
        "workers=[1,2]",
        f"data.cache_dir={cache}",
        "data.n_images=120",
        "batch_size=8",
        "budget_s=30",
        "tracking=false",
        f"hydra.run.dir={out}",
    ]
    # 1 MB: not the 3 batches of 8 float32 crops (2.7 MiB) one dataset worker needs at once.
    output, status = in_small_shm("1m", command, isolated_env, timeout=300)
    assert status == 0, output[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in output.splitlines()}
    skipped = "shared memory too small from n_workers=1: its 1 worker process hands batches"
    assert skipped in rows["dataset"]
    assert "but /dev/shm has 1.0 MiB free (of 1.0 MiB)" in rows["dataset"]
    assert "| raw | yes |" in output  # threads: measured, and feeding
