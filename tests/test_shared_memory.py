"""A small /dev/shm (Docker's default 64 MB): every loader refused up front in one line, or run;
a run that meets the limit anyway ends in one line; none hangs. Real runs in a private mount
namespace with a small tmpfs on /dev/shm, where `unshare -m` is permitted."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from facebench import loaders
from facebench.config import Workers
from facebench.errors import ConfigError
from facebench.host import shared_memory
from facebench.host.paths import PROJECT_ROOT
from facebench.host.shared_memory import MIB, InFlight, Space
from facebench.loaders.spec import Handover
from facebench.run.finish import AHEAD, batches_held
from tests.helpers import LOADERS, TRAITS, in_two_sweeps

FILL = Path(__file__).with_name("fill_shm.py")
INSTALLED = [name for name in LOADERS if loaders.get(name).available()]
# Loaders whose worker processes hand batches over through /dev/shm (not Ray's object store).
PROCESS = [
    name
    for name in INSTALLED
    if TRAITS[name].workers == Workers.process and loaders.get(name).through_shared_memory
]
# Batch 600, two workers, loader only on the CPU, as the issue ran them; a batch for each worker.
RUN = ["model=none", "n_workers=2", "batch_size=600", "data.n_images=1200", "device=cpu"]


def small(batch_size: int) -> int:
    """A batch's labels, ids and crop offsets: three int64 tensors (offsets two per image),
    each in a file of whole 4 KiB pages."""
    return 3 * -(-batch_size * 32 // 4096) * 4096


def expected_need(name: str, prefetch: int = 2) -> int:
    """What `name`'s two workers have in shared memory at once with RUN's settings, the obvious
    way: 2 x prefetch_factor ready batches (nodes: its ParallelMapper keeps 2 per worker
    whatever the prefetch), the one the loop holds, the two a CPU loop finishes ahead, and
    those the pipeline keeps received (nodes' Prefetcher: prefetch_factor)."""
    traits = loaders.get(name).traits_for()
    image = 4 * 3 * 100 * 100 if traits.handover == Handover.normalized else 112 * 112 * 3
    ready, received = (2, prefetch) if name == "nodes" else (prefetch, 0)
    return (2 * ready + 1 + AHEAD + received) * (600 * image + small(600))


def test_the_refusal_names_both_sizes_and_what_fits(monkeypatch):
    image = 4 * 3 * 100 * 100
    batch = InFlight("dataset", 2, 2, 3, 600, image, "float32 3x100x100", shallow=5)
    assert (batch.batches, batch.need) == (7, 7 * (600 * image + small(600)))
    room = Space(Path("/dev/shm"), 64 * MIB, 60 * MIB)
    monkeypatch.setattr(shared_memory, "space", lambda: room)
    with pytest.raises(ConfigError) as raised:
        shared_memory.check(batch, lambda: ["raw", "dali"])
    assert str(raised.value) == (
        "loader=dataset: its 2 worker processes hand batches over through shared memory, up to 7 "
        "batches of 600 images (float32 3x100x100, 68.7 MiB each) at once: about 481.1 MiB, but "
        "/dev/shm has 60.0 MiB free (of 64.0 MiB). Give it more: docker run --shm-size=640m (a "
        "Kubernetes pod: an emptyDir with medium: Memory mounted at /dev/shm), or batch_size=74 "
        "or smaller, or workers that are threads (loader=raw, loader=dali); resource_check=false "
        "starts it anyway"
    )
    # The largest batch named fits, and the next does not.
    assert InFlight("dataset", 2, 2, 3, 74, image, "x").fits(room)
    assert not InFlight("dataset", 2, 2, 3, 75, image, "x").fits(room)
    # With room for 6 batches of 600: fewer workers, and a shallower prefetch where it is fewer.
    roomy = Space(Path("/dev/shm"), 500 * MIB, 420 * MIB)
    three = InFlight("dataset", 3, 2, 3, 600, image, "x", shallow=6)
    said = shared_memory.remedies(three, roomy, ["raw"])
    assert "n_workers=1" in said and "loader.prefetch_factor=1" in said
    nodes = InFlight("nodes", 3, 2, 3, 600, image, "x", thread_option="loader.method=thread")
    said = shared_memory.remedies(nodes, roomy, ["raw"])
    assert "loader.prefetch_factor=1" not in said  # not given: it would not be fewer
    assert "workers that are threads (loader.method=thread, loader=raw)" in said
    # --shm-size counts what else is in /dev/shm: 300 MiB used here, by others.
    crowded = Space(Path("/dev/shm"), 400 * MIB, 100 * MIB)
    assert "--shm-size=1024m" in shared_memory.remedies(batch, crowded, [])  # (300 + 481) x 1.25
    # Ranks on one machine share its /dev/shm.
    ranks = InFlight("nodes", 2, 2, 1, 600, image, "x", ranks=4)
    assert ranks.need == 4 * 5 * (600 * image + small(600))
    assert ranks.describe().endswith("at once per rank: about 1,374.5 MiB in all")
    shared_memory.check(batch, list, enabled=False)  # resource_check=false: no refusal
    shared_memory.check(None, list)  # a loader without worker processes: nothing to check


def test_running_out_past_the_check_says_why(monkeypatch):
    from facebench.loaders.failures import explain

    image = 112 * 112 * 3
    batch = InFlight("nodes", 2, 2, 5, 600, image, "uint8 112x112x3")
    whole = Space(Path("/dev/shm"), 48 * MIB, 4 * MIB)
    monkeypatch.setattr(shared_memory, "space", lambda: whole)
    shared_memory.check(batch, lambda: ["raw"], enabled=False)  # resource_check=false
    torch_said = RuntimeError(
        "Caught RuntimeError in _apply_udf.\nOriginal Traceback (most recent call last):\n"
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_1_2_3>: No space "
        "left on device (28)"
    )
    assert str(explain(torch_said, "nodes")) == (
        "loader=nodes: its workers ran out of shared memory for a batch: /dev/shm holds 48.0 MiB "
        "(4.0 MiB free now), and its 2 worker processes hand batches over through shared "
        "memory, up to 9 batches of 600 images (uint8 112x112x3, 21.6 MiB each) at once: about "
        "194.3 MiB. Give it more: docker run --shm-size=256m (a Kubernetes pod: an emptyDir with "
        "medium: Memory mounted at /dev/shm), or batch_size=147 or smaller, or workers that are "
        "threads (loader=raw)"
    )
    # Room enough for the run, filled by someone else: said so, and no smaller --shm-size.
    filled = Space(Path("/dev/shm"), 1024 * MIB, 1 * MIB)
    monkeypatch.setattr(shared_memory, "space", lambda: filled)
    said = str(explain(torch_said, "nodes"))
    assert said.startswith(
        "loader=nodes: its workers ran out of shared memory for a batch: /dev/shm holds "
        "1,024.0 MiB (1.0 MiB free now), room for the 194.3 MiB its batches need at most, so "
        "another process filled it (`ls -la /dev/shm` shows what is there). Free it, or give it "
        "more: docker run --shm-size=1536m"
    )
    # A queue's semaphore that finds /dev/shm full as the workers start: the same one line.
    no_room = OSError(28, "No space left on device")
    assert str(explain(no_room, "nodes")).startswith("loader=nodes: its workers ran out of")
    monkeypatch.setattr(shared_memory, "space", lambda: whole)  # 4 MiB free: a disk, not shm
    assert explain(no_room, "nodes") is None


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
    shallow = make_cfg(
        f"loader={name}", "n_workers=2", "batch_size=600", "loader.prefetch_factor=1"
    )
    held = batches_held(ctx.device, host_only=False)
    one = loaders.in_flight(name, spec, context(shallow, synthetic_root), held)
    assert one.need == expected_need(name, prefetch=1)
    assert on_cpu.shallow == one.batches
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


@in_two_sweeps(INSTALLED)
@pytest.mark.slow
def test_in_48_mb_every_loader_is_refused_in_one_line_or_runs(
    tmp_path, cache, isolated_env, loaders
):
    command = sweep(tmp_path, cache, f"loader={','.join(loaders)}")
    output, status = in_small_shm("48m", command, isolated_env, timeout=400)
    refused, jobs = errors(output), finished(tmp_path)
    assert "Traceback" not in output
    assert sorted(refused) == [name for name in PROCESS if name in loaders], output[-3000:]
    for name, line in refused.items():
        need = float(re.search(r"at once: about ([\d,.]+) MiB", line).group(1).replace(",", ""))
        assert need == pytest.approx(expected_need(name) / MIB, abs=0.05), line
        # Nearly all of it free (a shard build just before may leave a semaphore or two).
        free = re.search(r"but /dev/shm has ([\d.]+) MiB free \(of 48.0 MiB\)", line).group(1)
        assert 47 < float(free) <= 48, line
        assert "docker run --shm-size=" in line and "resource_check=false" in line
    for name in set(loaders) - set(PROCESS):  # threads, Ray: no /dev/shm to run out of
        assert jobs[name]["status"] == "FINISHED" and jobs[name]["metrics"]["samples_seen"] == 1200
    assert status == (1 if refused else 0)


@pytest.mark.slow
def test_past_the_check_running_out_ends_in_one_line(tmp_path, cache, isolated_env):
    # 10 batches of 120: uint8 loaders fit two of theirs (4.3 MiB) in 10 MB, and must meet the
    # limit; float ones meet it at their first (13.7 MiB).
    overrides = ("resource_check=false", "batch_size=120")
    command = sweep(tmp_path, cache, *overrides, f"loader={','.join(PROCESS)}")
    output, status = in_small_shm("10m", command, isolated_env, timeout=400)
    failed = errors(output)
    assert "Traceback" not in output
    assert sorted(failed) == PROCESS, output[-3000:]
    for line in failed.values():
        assert "its workers ran out of shared memory for a batch: /dev/shm holds 10.0 MiB" in line
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
    output, status = in_small_shm("256m", command, isolated_env, timeout=300)
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
    # Threads need no shared memory: raw was measured (a rate with its workers), fed or not: on
    # a busy machine its rate may fall short of the h100's, and "fewest workers" is then "-".
    raw = re.search(r"\| raw \| (yes|no) \| [\d-]+ \| [\d,]+ \(\d\) \|", output)
    assert raw, output[-2500:]


@pytest.mark.slow
def test_a_temporary_folder_too_long_for_the_workers_sockets_is_refused_not_hung(
    tmp_path, cache, isolated_env, request
):
    """Workers hand each batch's file descriptors over a Unix socket in TMPDIR: in a folder one
    byte too long the run is refused in one line (it once waited forever for a batch that its
    worker's feeder thread failed to send); in the longest one allowed, batches cross."""
    base = Path(tempfile.mkdtemp(prefix="fb-"))  # pytest's own folders are long already
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    most = 107 - len("/pymp-XXXXXXXX/listener-XXXXXXXX")
    folders = {}
    for extra in (0, 1):
        folder = base / ("x" * (most + extra - len(str(base)) - 1))
        folder.mkdir()
        folders[extra] = folder
    assert len(str(folders[0])) == most

    def run(folder: Path) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "loader=dataset",
            "model=none",
            "device=cpu",
            "n_workers=2",
            "batch_size=20",
            "data.n_images=120",
            f"data.cache_dir={cache}",
            "tracking=false",
            f"hydra.run.dir={tmp_path / folder.name[:8] / str(len(folder.name))}",
        ]
        env = {**isolated_env, "TMPDIR": str(folder)}
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    fits = run(folders[0])
    assert fits.returncode == 0, fits.stderr[-3000:]
    refused = run(folders[1])
    output = refused.stdout + refused.stderr
    assert refused.returncode == 1 and "Traceback" not in output, output[-3000:]
    [line] = [line for line in output.splitlines() if "too long for the sockets" in line]
    assert f"the temporary folder {folders[1]} ({most + 1} bytes, from TMPDIR)" in line
    assert f"Set TMPDIR to a folder of at most {most} bytes" in line
