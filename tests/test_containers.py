"""Inside a container: limits read from cgroups (fake trees, and real cgroups where this machine
lets a test make one), the resource check and advise within them, and runs whose process the
OOM killer took closed at the next start."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlflow
import psutil
import pytest

from facebench.errors import ConfigError
from facebench.host import cgroups, ports, resources
from facebench.host.paths import PROJECT_ROOT
from facebench.host.resources import Allowance
from facebench.loaders import failures
from facebench.tracking import run_owner

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
    files = {
        "sys/fs/cgroup/box/memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 5\n",
        "sys/fs/cgroup/memory.events": "oom_kill 9\n",  # the parent's: never read
    }
    v2 = fake_tree(tmp_path / "v2", "0::/box\n", V2_MOUNTS, files)
    assert cgroups.oom_kills(v2) == 5
    # memory.events counts the children's kills too; memory.events.local, this cgroup's own.
    files["sys/fs/cgroup/box/memory.events.local"] = "oom 1\noom_kill 1\n"
    v2 = fake_tree(tmp_path / "v2-local", "0::/box\n", V2_MOUNTS, files)
    assert cgroups.oom_kills(v2) == 1
    assert cgroups.memory_limits(tmp_path / "nothing") == []
    assert cgroups.cpu_quota(tmp_path / "nothing") is None


def test_a_host_tree_mounted_over_the_containers_is_the_one_read(tmp_path):
    # systemd in Docker on v1 (-v /sys/fs/cgroup:/sys/fs/cgroup:ro): the container's own mount
    # (root /docker/abc) is hidden by the host's tree mounted later at the same place.
    mounts = (
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "90 31 0:32 / /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    )
    root = fake_tree(
        tmp_path,
        "4:memory:/docker/abc\n",
        mounts,
        {
            "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": str(GIB),
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        },
    )
    [limit] = cgroups.memory_limits(root)
    assert (limit.limit, limit.path) == (GIB, root / "sys/fs/cgroup/memory/docker/abc")


def test_cgroups_out_of_sight_and_odd_bytes_read_as_no_limit(tmp_path):
    # A process outside its cgroup namespace's root sees "/../sibling": nothing to read here.
    outside = fake_tree(
        tmp_path / "outside",
        "0::/../sibling\n",
        V2_MOUNTS,
        {"sys/fs/cgroup/memory.max": str(GIB), "sibling/memory.max": str(GIB)},
    )
    assert cgroups.memory_limits(outside) == []
    # A cgroup that no mount holds (the mount's root is another cgroup).
    elsewhere = fake_tree(
        tmp_path / "elsewhere",
        "4:memory:/docker/abc\n",
        V1_MOUNTS.format(root="/docker/xyz"),
        {"sys/fs/cgroup/memory/memory.limit_in_bytes": str(GIB)},
    )
    assert cgroups.memory_limits(elsewhere) == []
    # A mount point whose name is not UTF-8 elsewhere in mountinfo.
    odd = fake_tree(tmp_path / "odd", "0::/box\n", V2_MOUNTS, {})
    with open(odd / "proc/self/mountinfo", "ab") as file:
        file.write(b"99 23 0:50 / /media/caf\xe9 rw - ext4 /dev/sdb1 rw\n")
    (odd / "sys/fs/cgroup/box").mkdir(parents=True)
    (odd / "sys/fs/cgroup/box/memory.max").write_text(str(GIB))
    assert cgroups.tightest_memory(odd).limit == GIB


@pytest.fixture
def roomy_host(monkeypatch):
    """A host with far more memory available than any container limit in these tests."""
    roomy = psutil.virtual_memory()._replace(available=1024 * GIB)
    monkeypatch.setattr(resources.psutil, "virtual_memory", lambda: roomy)


def test_allowance_takes_the_tighter_of_host_and_container(monkeypatch, roomy_host):
    limit = cgroups.MemoryLimit(Path("/sys/fs/cgroup/memory/box"), int(2.5 * GIB), GIB // 2)
    monkeypatch.setattr(cgroups, "tightest_memory", lambda: limit)
    monkeypatch.setattr(resources, "_quota", lambda: cgroups.CpuQuota(Path("/q"), 1.0))
    monkeypatch.setattr(resources, "_affinity", lambda: 64)
    allowed = resources.allowance()
    assert (allowed.cores, allowed.cpus, resources.usable_cores()) == (1, 1.0, 1)
    assert (allowed.memory, allowed.memory_in_use) == (2 * GIB, GIB // 2)
    assert allowed.tags() == {
        "container_cpu_limit": "cgroup CPU quota 1 CPU at /q",
        "container_memory_limit": "cgroup memory limit 2.5 GiB at /sys/fs/cgroup/memory/box",
    }
    # A quota of 1.5 CPUs on 2 cores: both cores used, 1.5 CPUs' time.
    monkeypatch.setattr(resources, "_affinity", lambda: 2)
    monkeypatch.setattr(resources, "_quota", lambda: cgroups.CpuQuota(Path("/q"), 1.5))
    allowed = resources.allowance()
    assert (allowed.cores, allowed.cpus, allowed.cores_limit) == (
        2,
        1.5,
        "cgroup CPU quota 1.5 CPUs at /q",
    )
    # A host with less available than the container's limit leaves: the host's figure, no tag.
    tight = psutil.virtual_memory()._replace(available=GIB)
    monkeypatch.setattr(resources.psutil, "virtual_memory", lambda: tight)
    monkeypatch.setattr(resources, "_affinity", lambda: 64)
    monkeypatch.setattr(resources, "_quota", lambda: cgroups.CpuQuota(Path("/q"), 128.0))
    assert resources.allowance() == Allowance(64, GIB, cpus=64.0)


def test_workers_the_container_cannot_hold_are_refused_naming_its_limit(monkeypatch, roomy_host):
    limit = cgroups.MemoryLimit(Path("/sys/fs/cgroup/memory/box"), int(2.5 * GIB), GIB // 2)
    monkeypatch.setattr(cgroups, "tightest_memory", lambda: limit)
    with pytest.raises(ConfigError) as raised:
        resources.check_workers("pickle", 10, 271 * 2**20)
    assert str(raised.value) == (
        "n_workers=10: 10 workers of loader=pickle need about 2.6 GiB (271 MiB each: the "
        "process, its prefetched batches and what the loader holds), but 2.0 GiB are available "
        "(cgroup memory limit 2.5 GiB at /sys/fs/cgroup/memory/box, 0.5 GiB of it in use, page "
        "cache not counted). Use n_workers=7 or fewer (or a smaller batch_size), raise the limit "
        "(docker run --memory, a pod's limits.memory, SLURM's --mem, systemd's MemoryMax), or "
        "resource_check=false to start them anyway"
    )
    resources.check_workers("pickle", 7, 271 * 2**20)  # fits: no error


def test_a_rank_takes_a_core_for_each_worker_and_its_loops_share():
    assert resources.cores_per_rank(4) == 5  # a training loop's whole core
    assert resources.cores_per_rank(4, loop=0.0) == pytest.approx(4 + resources.LOOP_MIN)
    assert resources.ranks_that_fit(16, 3) == 4
    assert resources.ranks_that_fit(16, 3, loop=0.5) == 4  # 16 // 3.5
    assert resources.ranks_that_fit(16, 2, loop=0.5) == 6  # 16 // 2.5
    assert resources.ranks_that_fit(2, 5) == 1  # at least the one asked to run
    assert resources.worker_cores(8, 2) == 6 and resources.worker_cores(8, 2, loop=0.25) == 7.5
    assert resources.worker_cores(1, 4) == 0
    # What fits by one count fits by the other: ranks_that_fit ranks leave each its workers.
    for cores in range(1, 33):
        for workers in range(1, 9):
            fit = resources.ranks_that_fit(cores, workers)
            assert fit == 1 or resources.worker_cores(cores, fit) >= fit * workers


def test_ranks_crowding_the_cores_are_told_that_fewer_ranks_is_the_fix(monkeypatch, caplog):
    # accelerators_per_host=4 n_workers=1 on 2 cores: no n_workers helps (each rank has its
    # own); one rank's loop and worker fit two cores.
    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    with caplog.at_level("WARNING", logger=resources.log.name):
        resources.check_workers(
            "raw", 1, 0, 4, enabled=False, ranks_setting="accelerators_per_host"
        )
    assert caplog.messages == [
        "accelerators_per_host=4 x n_workers=1: 4 x 1 = 4 worker processes, and the 4 ranks' "
        "own loops, share 2 cores, so each rank is fed slower than it would be alone. Fewer "
        "ranks is the fix: accelerators_per_host=1 gives each rank's loop and workers a core of "
        "their own"
    ]
    # Where fewer workers would do, both are named; a torchrun job's ranks (its GPUs) last.
    monkeypatch.setattr(resources, "usable_cores", lambda: 16)
    caplog.clear()
    with caplog.at_level("WARNING", logger=resources.log.name):
        resources.check_workers("raw", 8, 0, 4, enabled=False)
    [said] = caplog.messages
    assert said.startswith("4 ranks on this host x n_workers=8: 4 x 8 = 32 worker processes")
    assert (
        "Fewer workers or ranks is the fix: n_workers=3, or 1 rank (accelerators_per_host=1, or "
        "torchrun --nproc_per_node=1), gives"
    ) in said


def test_a_dead_worker_is_put_down_to_the_oom_killer_only_for_kills_since_it_started(
    monkeypatch,
):
    limit = cgroups.MemoryLimit(Path("/sys/fs/cgroup/memory/box"), int(2.5 * GIB), 0)
    kills = iter([3, 3, 4])  # three from an earlier run; then none; then one more
    monkeypatch.setattr(cgroups, "oom_kills", lambda: next(kills))
    monkeypatch.setattr(cgroups, "tightest_memory", lambda: limit)
    failures.count_oom_kills_from_now()
    assert "out-of-memory killer killed" not in str(failures.worker_died("dataset", 7, "x"))
    said = str(failures.worker_died("dataset", 7, "exited unexpectedly"))
    assert said == (
        "loader=dataset: a worker process (pid 7) died: exited unexpectedly; the out-of-memory "
        "killer killed 1 process(es) of this memory cgroup (limit 2.5 GiB at "
        "/sys/fs/cgroup/memory/box) since the workers started: use fewer n_workers or a smaller "
        "batch_size, or raise the limit (docker run --memory, a pod's limits.memory, SLURM's --mem)"
    )


# Orphaned runs: a run whose process was killed outright.


def dead_process() -> tuple[int, float]:
    """The pid and start time of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(process.pid).create_time()
    process.wait()
    return process.pid, started


@pytest.fixture
def store(tmp_path, empty_store):
    """(a client of a fresh SQLite store, its URI, an experiment id)."""
    (tmp_path / "mlflow.db").write_bytes(empty_store.read_bytes())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    return client, uri, client.create_experiment("facebench")


def statuses(client, ids: dict[str, str]) -> dict[str, str]:
    return {name: client.get_run(run_id).info.status for name, run_id in ids.items()}


def test_a_gone_owner_is_put_down_to_the_oom_killer_only_when_its_cgroup_counted_a_kill(
    monkeypatch,
):
    tags = run_owner.Ownership("").tags()
    assert tags[run_owner.OOM_KILLS_TAG] == str(cgroups.oom_kills())
    quiet = run_owner.ended_by(tags)
    assert "OOM killer killed nothing" in quiet and "killed 1" not in quiet
    counted = cgroups.oom_kills() + 2
    monkeypatch.setattr(cgroups, "oom_kills", lambda root=None: counted)
    if tags.get(run_owner.CGROUP_TAG):  # a machine whose memory cgroup can be read
        assert "OOM killer killed 2 process(es)" in run_owner.ended_by(tags)
    elsewhere = {**tags, run_owner.CGROUP_TAG: "/another/container"}
    unknown = run_owner.ended_by(elsewhere)
    assert "dmesg" in unknown and "killed nothing" not in unknown and "killed 2" not in unknown
    assert "dmesg" in run_owner.ended_by({})  # a run opened before these tags


def test_in_a_sqlite_store_a_run_whose_lock_is_free_is_closed(store):
    client, uri, experiment = store
    owners = {name: run_owner.Ownership(uri) for name in ("alive", "killed", "lost")}
    ids = {
        name: client.create_run(experiment, tags=owner.tags(), run_name=name).info.run_id
        for name, owner in owners.items()
    }
    ids["untagged"] = client.create_run(experiment, run_name="untagged").info.run_id
    owners["killed"]._close()  # what the kernel does for a killed process: the lock is dropped
    owners["lost"].release()  # ended without ending its run (its store was gone)
    assert sorted(run_owner.close_orphans(client, experiment, uri)) == ["killed", "lost"]
    assert statuses(client, ids) == {
        "alive": "RUNNING",
        "killed": "KILLED",
        "lost": "KILLED",
        "untagged": "RUNNING",
    }
    why = client.get_run(ids["killed"]).data.tags[run_owner.ENDED_TAG]
    # Not put down to the OOM killer: its cgroup (this process's) counted no kill meanwhile.
    assert why.startswith(run_owner.GONE) and "OOM killer killed nothing" in why
    assert [path.name for path in owners["alive"].path.parent.iterdir()] == [
        owners["alive"].path.name  # the closed run's lock file went with it
    ]
    owners["alive"].release()
    assert run_owner.close_orphans(client, experiment, uri) == ["alive"]


def test_a_run_its_owner_ends_meanwhile_is_not_closed(store):
    client, uri, experiment = store
    owner = run_owner.Ownership(uri)
    run_id = client.create_run(experiment, tags=owner.tags(), run_name="ending").info.run_id

    class EndsMeanwhile(type(client)):
        def get_run(self, run_id):
            client.set_terminated(run_id, "FINISHED")  # between the search and the check
            owner.release()
            return super().get_run(run_id)

    owner._close()
    ending = EndsMeanwhile(uri)
    assert run_owner.close_orphans(ending, experiment, uri) == []
    assert client.get_run(run_id).info.status == "FINISHED"
    assert run_owner.ENDED_TAG not in client.get_run(run_id).data.tags


def test_with_a_tracking_server_only_a_visible_process_gone_closes_its_run(store):
    client, uri, experiment = store
    server = "http://tracking.example:5000"  # decided by the tags, as for a remote store
    me = run_owner.Ownership(server).tags()
    pid, started = dead_process()
    owners = {
        "dead": {**me, run_owner.PID_TAG: str(pid), run_owner.STARTED_TAG: f"{started:.2f}"},
        # The pid of a running process, but not the process that opened the run.
        "reused": {**me, run_owner.STARTED_TAG: f"{float(me[run_owner.STARTED_TAG]) - 100:.2f}"},
        "alive": me,
        # Processes that cannot be looked up from here: they are left as they are.
        "other namespace": {**me, run_owner.PID_TAG: str(pid), run_owner.NAMESPACE_TAG: "pid:[1]"},
        "other boot": {**me, run_owner.PID_TAG: str(pid), run_owner.BOOT_TAG: "another"},
        "other user": {**me, run_owner.PID_TAG: str(pid), run_owner.USER_TAG: "4242"},
        "untagged": {},
    }
    assert run_owner.LOCK_TAG not in me
    ids = {
        name: client.create_run(experiment, tags=tags, run_name=name).info.run_id
        for name, tags in owners.items()
    }
    assert sorted(run_owner.close_orphans(client, experiment, server)) == ["dead", "reused"]
    assert {name for name, status in statuses(client, ids).items() if status == "KILLED"} == {
        "dead",
        "reused",
    }


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
    said = next_run.stdout + next_run.stderr
    assert next_run.returncode == 0, said
    runs = mlflow.search_runs(experiment_names=["facebench"], output_format="list")
    status = sorted((run.info.status, run.data.tags.get(run_owner.ENDED_TAG, "")) for run in runs)
    assert [state for state, _ in status] == ["FINISHED", "KILLED"]
    # SIGKILL, not the OOM killer, and the kernel's count of OOM kills says so.
    assert status[1][1].startswith(run_owner.GONE) and "OOM killer killed nothing" in status[1][1]
    assert "was still RUNNING" in said and "marked KILLED" in said
    assert list((tmp_path / "mlflow.db-owners").iterdir()) == []  # no lock left behind


# Real cgroups: where this machine lets a test make one (root, a writable cgroup hierarchy).


def new_cgroup(controller: str) -> Path:
    """A fresh cgroup with `controller` for one test (v1, or v2 where it is enabled for new
    cgroups), or the test skipped with the reason. Its path as facebench names it (resolved: a
    v1 `cpu` is often a link to `cpu,cpuacct`)."""
    v1, v2 = Path("/sys/fs/cgroup") / controller, Path("/sys/fs/cgroup")
    if (v1 / "cgroup.procs").exists():
        base = v1.resolve()
    elif controller in _words(v2 / "cgroup.subtree_control"):
        base = v2
    else:
        pytest.skip(f"no cgroup hierarchy with the {controller} controller to make a cgroup in")
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


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def in_cgroup(folder: Path, command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """command run as a member of the cgroup (joined before it executes)."""

    def join() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(command, preexec_fn=join, **kwargs)  # noqa: PLW1509


def remove(folder: Path) -> None:
    """Kill whatever is still in the cgroup (a timed-out command's workers), then remove it."""
    deadline = time.monotonic() + 30
    while True:
        for pid in _words(folder / "cgroup.procs"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            folder.rmdir()
            return
        except OSError:  # members still exiting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def write_limit(folder: Path, v1_name: str, v2_name: str, v1_value: str, v2_value: str) -> None:
    if (folder / v1_name).exists():
        (folder / v1_name).write_text(v1_value)
    elif (folder / v2_name).exists():
        (folder / v2_name).write_text(v2_value)
    else:
        pytest.skip(f"{folder} has neither {v1_name} nor {v2_name}")


@pytest.mark.slow
def test_in_a_2_5_gb_memory_cgroup_ten_pickle_workers_are_refused(tmp_path, cache, isolated_env):
    if psutil.virtual_memory().available < 4 * GIB:
        pytest.skip("the host has less than 4 GiB available: its own figure would refuse first")
    folder = new_cgroup("memory")
    limit = str(int(2.5 * GIB))
    try:
        write_limit(folder, "memory.limit_in_bytes", "memory.max", limit, limit)
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
    assert "raise the limit (docker run --memory" in error
    assert "Traceback" not in said


def test_advise_counts_workers_within_a_cpu_quota(tmp_path):
    if resources.usable_cores() < 2:
        pytest.skip("one core: a quota of one CPU leaves as many")
    folder = new_cgroup("cpu")
    ask = (
        "from facebench.advise.measure import worker_counts; "
        "from facebench.host.resources import allowance; "
        "print(worker_counts([]), allowance().cores_limit)"
    )
    try:
        # One CPU: docker run --cpus=1.
        write_limit(folder, "cpu.cfs_quota_us", "cpu.max", "100000", "100000 100000")
        result = in_cgroup(
            folder, [sys.executable, "-c", ask], capture_output=True, text=True, timeout=120
        )
    finally:
        remove(folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"[1] cgroup CPU quota 1 CPU at {folder}"


def test_the_report_names_the_machines_and_their_container_limits():
    from facebench.report.markdown import render_machines

    host = {"cpu": "Xeon", "cpu_cores": "64", "gpu": "none"}
    boxed = {
        "cpu": "Xeon",
        "cpu_cores": "2",
        "gpu": "NVIDIA H100",
        "container_cpu_limit": "cgroup CPU quota 2 CPUs at /c",
        "container_memory_limit": "cgroup memory limit 8.0 GiB at /m",
    }
    assert render_machines([host, host, boxed, boxed]) == (
        "Measured on Xeon, 64 cores; Xeon, 2 cores, NVIDIA H100 (within a cgroup CPU quota 2 "
        "CPUs at /c; a cgroup memory limit 8.0 GiB at /m).\n\n"
    )
    assert render_machines([]) == ""


def test_a_free_port_is_free_until_something_listens_on_it():
    port = ports.free_port()
    assert 1024 <= port <= 65535 and not ports.port_in_use(port)
    with socket.socket() as listening:
        listening.bind((ports.LOOPBACK, port))
        listening.listen()
        assert ports.port_in_use(port)
        assert ports.free_port() != port
