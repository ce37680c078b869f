"""Inside a container: limits read from cgroups (fake trees, and real cgroups where this machine
lets a test make one), the resource check and advise within them, and runs whose process the
OOM killer took closed at the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlflow
import psutil
import pytest

from facebench import cgroups, resources, run_owner
from facebench.errors import ConfigError
from facebench.paths import PROJECT_ROOT
from facebench.resources import Allowance

GIB = 2**30
V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def fake_tree(root: Path, membership: str, mounts: str, files: dict[str, str]) -> Path:
    """A fake /proc/self and /sys/fs/cgroup under root: files are {path below root: text}."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(membership)
    (root / "proc/self/mountinfo").write_text(mounts)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_a_docker_v1_memory_limit_is_read_with_its_use_less_the_page_cache(tmp_path):
    # Docker on cgroup v1: the mount's root is the container's own cgroup.
    memory = "sys/fs/cgroup/memory"
    root = fake_tree(
        tmp_path,
        "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        V1_MOUNTS.format(root="/docker/abc"),
        {
            f"{memory}/memory.limit_in_bytes": str(int(2.5 * GIB)),
            f"{memory}/memory.usage_in_bytes": str(1 * GIB),
            f"{memory}/memory.stat": f"cache 5\ntotal_inactive_file {GIB // 4}\n",
        },
    )
    [limit] = cgroups.memory_limits(root)
    assert limit.path == root / memory
    assert limit.limit == int(2.5 * GIB)
    assert limit.used == GIB - GIB // 4  # reclaimable page cache is not counted as used
    assert limit.free == int(2.5 * GIB) - (GIB - GIB // 4)


def test_v1_without_a_limit_and_a_v1_ancestor_limit(tmp_path):
    memory = "sys/fs/cgroup/memory"
    unlimited = fake_tree(
        tmp_path / "unlimited",
        "4:memory:/user.slice\n",
        V1_MOUNTS.format(root="/"),
        {f"{memory}/user.slice/memory.limit_in_bytes": "9223372036854771712"},
    )
    assert cgroups.memory_limits(unlimited) == []
    assert cgroups.tightest_memory(unlimited) is None
    # The container's own cgroup is unlimited, a parent it cannot see is not: memory.stat's
    # hierarchical_memory_limit says so.
    parent = fake_tree(
        tmp_path / "parent",
        "4:memory:/docker/abc\n",
        V1_MOUNTS.format(root="/docker/abc"),
        {
            f"{memory}/memory.limit_in_bytes": "9223372036854771712",
            f"{memory}/memory.stat": f"hierarchical_memory_limit {3 * GIB}\n",
            f"{memory}/memory.usage_in_bytes": str(GIB),
        },
    )
    assert cgroups.tightest_memory(parent).limit == 3 * GIB


def test_nested_v2_limits_the_one_leaving_least_free_wins(tmp_path):
    base = "sys/fs/cgroup/kubepods/pod1"
    files = {
        f"{base}/memory.max": str(4 * GIB),  # the pod: roomy, and not used much
        f"{base}/memory.current": str(2 * GIB),
        f"{base}/memory.stat": "anon 1\ninactive_file 0\n",
        f"{base}/ctr/memory.max": "max",  # the container sets none of its own
        f"{base}/ctr/memory.current": str(GIB),
        "sys/fs/cgroup/memory.current": str(10 * GIB),  # the root: no memory.max at all
    }
    root = fake_tree(tmp_path / "a", "0::/kubepods/pod1/ctr\n", V2_MOUNTS, files)
    [limit] = cgroups.memory_limits(root)
    assert (limit.path, limit.limit, limit.free) == (root / base, 4 * GIB, 2 * GIB)
    # A container limit of its own, nearly full: it leaves less than the pod does.
    files[f"{base}/ctr/memory.max"] = str(3 * GIB)
    files[f"{base}/ctr/memory.current"] = str(int(2.9 * GIB))
    files[f"{base}/ctr/memory.stat"] = f"inactive_file {GIB // 10}\n"
    root = fake_tree(tmp_path / "b", "0::/kubepods/pod1/ctr\n", V2_MOUNTS, files)
    assert [limit.limit for limit in cgroups.memory_limits(root)] == [3 * GIB, 4 * GIB]
    tightest = cgroups.tightest_memory(root)
    assert tightest.path == root / base / "ctr"
    assert tightest.free == pytest.approx(0.2 * GIB, abs=2)


def test_cpu_quotas_v1_and_v2_rounded_up_to_whole_cores(tmp_path):
    cpu = "sys/fs/cgroup/cpu,cpuacct"
    v1 = fake_tree(
        tmp_path / "v1",
        "3:cpu,cpuacct:/docker/abc\n",
        V1_MOUNTS.format(root="/docker/abc"),
        {f"{cpu}/cpu.cfs_quota_us": "150000", f"{cpu}/cpu.cfs_period_us": "100000"},
    )
    quota = cgroups.cpu_quota(v1)
    assert (quota.cpus, quota.cores, quota.path) == (1.5, 2, v1 / cpu)
    none = fake_tree(
        tmp_path / "none",
        "3:cpu,cpuacct:/\n",
        V1_MOUNTS.format(root="/"),
        {f"{cpu}/cpu.cfs_quota_us": "-1", f"{cpu}/cpu.cfs_period_us": "100000"},
    )
    assert cgroups.cpu_quota(none) is None
    files = {
        "sys/fs/cgroup/job/cpu.max": "400000 100000\n",
        "sys/fs/cgroup/job/step/cpu.max": "max 100000\n",
        "sys/fs/cgroup/job/step/task/cpu.max": "50000 100000\n",
    }
    v2 = fake_tree(tmp_path / "v2", "0::/job/step/task\n", V2_MOUNTS, files)
    quota = cgroups.cpu_quota(v2)
    assert (quota.cpus, quota.cores) == (0.5, 1)  # half a CPU still runs one process
    files["sys/fs/cgroup/job/step/task/cpu.max"] = "max 100000\n"
    v2 = fake_tree(tmp_path / "v2b", "0::/job/step/task\n", V2_MOUNTS, files)
    assert cgroups.cpu_quota(v2).cpus == 4.0  # the job's, two levels up


def test_mount_points_with_spaces_oom_counts_and_no_proc(tmp_path):
    mounts = "35 31 0:32 / /cg\\040root/memory rw - cgroup cgroup rw,memory\n"
    root = fake_tree(
        tmp_path / "spaces",
        "4:memory:/box\n",
        mounts,
        {
            "cg root/memory/box/memory.limit_in_bytes": str(GIB),
            "cg root/memory/box/memory.oom_control": "oom_kill_disable 0\noom_kill 3\n",
        },
    )
    assert cgroups.tightest_memory(root).limit == GIB
    assert cgroups.oom_kills(root) == 3
    v2 = fake_tree(
        tmp_path / "v2",
        "0::/box\n",
        V2_MOUNTS,
        {"sys/fs/cgroup/box/memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n"},
    )
    assert cgroups.oom_kills(v2) == 2
    assert cgroups.memory_limits(tmp_path / "nothing") == []
    assert cgroups.cpu_quota(tmp_path / "nothing") is None


def test_allowance_takes_the_tighter_of_host_and_container(monkeypatch):
    limit = cgroups.MemoryLimit(Path("/sys/fs/cgroup/memory/box"), int(2.5 * GIB), GIB // 2)
    monkeypatch.setattr(cgroups, "tightest_memory", lambda: limit)
    monkeypatch.setattr(resources, "_quota", lambda: cgroups.CpuQuota(Path("/q"), 1.0))
    monkeypatch.setattr(resources, "_affinity", lambda: 64)
    allowed = resources.allowance()
    assert allowed.cores == 1 and resources.usable_cores() == 1
    assert allowed.memory == 2 * GIB
    assert allowed.memory_limit == (
        "cgroup memory limit 2.5 GiB at /sys/fs/cgroup/memory/box, 0.5 GiB of it in use"
    )
    assert allowed.tags() == {
        "container_cpu_limit": "cgroup CPU quota 1 CPU at /q",
        "container_memory_limit": allowed.memory_limit,
    }
    # A host with less available than the container's limit leaves: the host's figure, no tag.
    tight = psutil.virtual_memory()._replace(available=GIB)
    monkeypatch.setattr(resources.psutil, "virtual_memory", lambda: tight)
    monkeypatch.setattr(resources, "_quota", lambda: cgroups.CpuQuota(Path("/q"), 128.0))
    assert resources.allowance() == Allowance(64, GIB)


def test_workers_the_container_cannot_hold_are_refused_naming_its_limit(monkeypatch):
    limit = cgroups.MemoryLimit(Path("/sys/fs/cgroup/memory/box"), int(2.5 * GIB), GIB // 2)
    monkeypatch.setattr(cgroups, "tightest_memory", lambda: limit)
    with pytest.raises(ConfigError) as raised:
        resources.check_workers("pickle", 10, 271 * 2**20)
    assert str(raised.value) == (
        "n_workers=10: 10 workers of loader=pickle need about 2.6 GiB (271 MiB each: the "
        "process, its prefetched batches and what the loader holds), but 2.0 GiB are available "
        "(cgroup memory limit 2.5 GiB at /sys/fs/cgroup/memory/box, 0.5 GiB of it in use). Use "
        "n_workers=7 or fewer (or a smaller batch_size), give the container more memory (docker "
        "run --memory, a pod's memory limit), or resource_check=false to start them anyway"
    )
    resources.check_workers("pickle", 7, 271 * 2**20)  # fits: no error


# Orphaned runs: a run whose process was killed outright.


def dead_process() -> tuple[int, float]:
    """The pid and start time of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(process.pid).create_time()
    process.wait()
    return process.pid, started


def test_runs_whose_process_is_gone_are_closed_others_kept(tmp_path, empty_store):
    (tmp_path / "mlflow.db").write_bytes(empty_store.read_bytes())
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("facebench")
    me = run_owner.tags()
    pid, started = dead_process()
    owners = {
        "dead": {**me, run_owner.PID_TAG: str(pid), run_owner.STARTED_TAG: f"{started:.2f}"},
        # The pid of a running process, but not the process that opened the run.
        "reused": {**me, run_owner.STARTED_TAG: f"{float(me[run_owner.STARTED_TAG]) - 100:.2f}"},
        "alive": me,
        "elsewhere": {**me, run_owner.HOST_TAG: "another-host", run_owner.PID_TAG: str(pid)},
        "untagged": {},
    }
    ids = {
        name: client.create_run(experiment, tags=tags, run_name=name).info.run_id
        for name, tags in owners.items()
    }
    assert sorted(run_owner.close_orphans(client, experiment)) == ["dead", "reused"]
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert status == {
        "dead": "KILLED",
        "reused": "KILLED",
        "alive": "RUNNING",
        "elsewhere": "RUNNING",
        "untagged": "RUNNING",
    }
    assert (
        "was gone when facebench next started"
        in client.get_run(ids["dead"]).data.tags[run_owner.ENDED_TAG]
    )


def train_command(tmp_path: Path, cache: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        str(PROJECT_ROOT / "train.py"),
        "device=cpu",
        f"data.cache_dir={cache}",
        "data.n_images=120",
        "batch_size=8",
        "model=none",
        f"hydra.run.dir={tmp_path / 'outputs' / uuid.uuid4().hex}",
        *overrides,
    ]


@pytest.mark.slow
def test_a_run_killed_outright_is_marked_killed_by_the_next_run(tmp_path, cache, isolated_env):
    # An emulated accelerator of 20 images/s: 120 images take 6 s, time enough to be killed.
    slow = train_command(tmp_path, cache, "accelerator=custom", "accelerator.images_per_s=20")
    victim = subprocess.Popen(slow, env=isolated_env, cwd=tmp_path, stderr=subprocess.DEVNULL)
    mlflow.set_tracking_uri(isolated_env["MLFLOW_TRACKING_URI"])
    try:
        deadline = time.monotonic() + 120
        while not mlflow.search_runs(
            experiment_names=["facebench"], filter_string="attributes.status = 'RUNNING'"
        ).shape[0]:
            assert victim.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
    finally:
        victim.send_signal(signal.SIGKILL)  # what the OOM killer sends
        victim.wait()
    next_run = subprocess.run(
        train_command(tmp_path, cache, "max_batches=1"),
        env=isolated_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert next_run.returncode == 0, next_run.stderr
    runs = mlflow.search_runs(experiment_names=["facebench"], output_format="list")
    status = sorted((run.info.status, run.data.tags.get(run_owner.ENDED_TAG, "")) for run in runs)
    assert [s for s, _ in status] == ["FINISHED", "KILLED"]
    assert f"its process (pid {victim.pid}) was gone" in status[1][1]
    said = next_run.stdout + next_run.stderr
    assert "was still RUNNING" in said and "marked KILLED" in said


# Real cgroups: where this machine lets a test make one (root, cgroup v1 controllers mounted).


def v1_cgroup(controller: str) -> Path:
    """A fresh cgroup of a v1 controller for one test, or the test skipped with the reason."""
    base = Path("/sys/fs/cgroup") / controller
    if not (base / "cgroup.procs").exists():
        pytest.skip(f"no cgroup v1 {controller} hierarchy at {base}")
    folder = base / f"facebench-test-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a cgroup at {folder}: {error}")
    try:
        in_cgroup(folder, [sys.executable, "-c", "pass"], check=True)
    except (subprocess.SubprocessError, OSError) as error:
        remove(folder)
        pytest.skip(f"cannot move a process into the cgroup {folder}: {error}")
    return folder


def in_cgroup(folder: Path, command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """command run as a member of the cgroup (joined before it executes)."""

    def join() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(command, preexec_fn=join, **kwargs)  # noqa: PLW1509


def remove(folder: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            folder.rmdir()
            return
        except OSError:  # members still exiting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.slow
def test_in_a_2_5_gb_memory_cgroup_ten_pickle_workers_are_refused(tmp_path, cache, isolated_env):
    folder = v1_cgroup("memory")
    try:
        (folder / "memory.limit_in_bytes").write_text(str(int(2.5 * GIB)))
        # `train.py model=none loader=pickle n_workers=10` at its defaults: batch 600, 6,000
        # images (a batch for each worker; generated in about 5 s, shards built in 2).
        command = train_command(
            tmp_path,
            cache,
            *("loader=pickle", "n_workers=10", "batch_size=600", "data.n_images=6000"),
            "tracking=false",
        )
        result = in_cgroup(
            folder, command, env=isolated_env, capture_output=True, text=True, timeout=300
        )
    finally:
        remove(folder)
    said = result.stdout + result.stderr
    assert result.returncode == 1, said
    [error] = [line for line in said.splitlines() if "[ERROR]" in line]
    assert "n_workers=10: 10 workers of loader=pickle need about" in error
    assert f"(cgroup memory limit 2.5 GiB at {folder}, " in error
    assert "give the container more memory" in error
    assert "Traceback" not in said


def test_advise_counts_workers_within_a_cpu_quota(tmp_path):
    folder = v1_cgroup("cpu")
    ask = (
        "from facebench.advise.measure import worker_counts; "
        "from facebench.resources import allowance; "
        "print(worker_counts([]), allowance().cores_limit)"
    )
    try:
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("100000")  # one CPU, docker run --cpus=1
        result = in_cgroup(
            folder, [sys.executable, "-c", ask], capture_output=True, text=True, timeout=120
        )
    finally:
        remove(folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"[1] cgroup CPU quota 1 CPU at {folder}"


def test_the_report_names_the_machines_and_their_container_limits():
    from facebench.report_markdown import render_machines

    host = {"cpu": "Xeon", "cpu_cores": "64", "gpu": "none"}
    boxed = {
        "cpu": "Xeon",
        "cpu_cores": "2",
        "gpu": "NVIDIA H100",
        "container_cpu_limit": "cgroup CPU quota 2 CPUs at /c",
        "container_memory_limit": "cgroup memory limit 8.0 GiB at /m, 0.5 GiB of it in use",
    }
    assert render_machines([host, host, boxed]) == (
        "Measured on Xeon, 64 cores; Xeon, 2 cores, NVIDIA H100 (within a cgroup CPU quota 2 "
        "CPUs at /c; a cgroup memory limit 8.0 GiB at /m, 0.5 GiB of it in use).\n\n"
    )
    assert render_machines([]) == ""
