"""What this process may use (cores, memory), and whether the requested workers fit in it.
Asked before any worker is forked.

A thousand workers fork a thousand processes and take the machine's memory down with them (and
leave the MLflow run RUNNING). Each worker costs its own memory (a forked process's pages that
stop being shared, about 20-40 MB measured here, counted as 64 MB), the batches it keeps ready
in shared memory (prefetch_factor of them), and whatever its loader holds (a pickle shard, a
shuffle buffer). A request whose estimate exceeds the memory available is refused with the
numbers; `resource_check=false` starts it anyway. More workers than cores only warns: the
article ran 10 workers, and that is a legitimate thing to measure.

Inside a container the machine is what its cgroups allow (facebench/host/cgroups.py), not what the
host has: `allowance()` is the one answer every part of facebench asks.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from functools import cache

import psutil

from facebench.errors import ConfigError
from facebench.host import cgroups

log = logging.getLogger(__name__)

WORKER_OWN_BYTES = 64 * 2**20
CONTAINER_TAGS = ("container_cpu_limit", "container_memory_limit")  # a run's, where one applied
# torch's DataLoader says the same as check_workers' warning, twice per loader (from two lines of
# its own) and once more for every epoch's loader, with nothing to do about it: check_workers
# says it once per job, with the worker count that uses every core.
warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
_FLOAT_BYTES = 4


def batch_bytes(batch_size: int, image_shape: tuple[int, ...], normalized: bool = True) -> int:
    """A batch's images: float32 when normalized on the host, uint8 when the device finishes
    them."""
    pixels = batch_size
    for size in image_shape:
        pixels *= size
    return pixels * (_FLOAT_BYTES if normalized else 1)


@dataclass(frozen=True)
class Allowance:
    """What this process may use: whole cores, and bytes of memory it may still take; each with
    the container limit that set it, where one did (empty where the host's own figure did)."""

    cores: int
    memory: int
    cores_limit: str = ""  # "cgroup CPU quota 1.5 CPUs at <cgroup folder>"
    memory_limit: str = ""  # "cgroup memory limit 2.5 GiB at <cgroup folder>"
    memory_in_use: int = 0  # of memory_limit, by the cgroup's processes
    cpus: float = 0.0  # CPUs' worth of time: the cores, or a quota's fraction of them

    def tags(self) -> dict[str, str]:
        """A run's tags naming the container limits that applied to it, if any."""
        limits = (self.cores_limit, self.memory_limit)
        return {tag: limit for tag, limit in zip(CONTAINER_TAGS, limits, strict=True) if limit}


def allowance() -> Allowance:
    """Cores: those this process may run on (affinity: taskset, cpusets), fewer where a CPU
    quota allows less time. Memory: the host's available memory, less where a cgroup's limit
    leaves less (its limit less what its processes already hold)."""
    cores, cpus, cores_limit = _cpu()
    memory = psutil.virtual_memory().available
    limit = cgroups.tightest_memory()
    if limit is None or limit.free >= memory:
        return Allowance(cores, memory, cores_limit, cpus=cpus)
    memory_limit = f"cgroup memory limit {gib(limit.limit)} at {limit.path}"
    return Allowance(cores, limit.free, cores_limit, memory_limit, limit.used, cpus)


def usable_cores() -> int:
    """The cores this process may use: its affinity, capped by a container's CPU quota."""
    return _cpu()[0]


def usable_cpus() -> float:
    """CPUs' worth of time this process may use: its cores, or a quota's fraction of them."""
    return _cpu()[1]


def _cpu() -> tuple[int, float, str]:
    """(whole cores, CPUs' worth of time, the quota that set them or "")."""
    cores = _affinity()
    quota = _quota()
    if quota is None or quota.cpus >= cores:
        return cores, float(cores), ""
    plural = "" if quota.cpus == 1 else "s"
    return quota.cores, quota.cpus, f"cgroup CPU quota {quota.cpus:g} CPU{plural} at {quota.path}"


# The least share of a core a rank's loop takes even where it never waits (it hands batches over).
LOOP_MIN = 0.1


def cores_per_rank(n_workers: int, loop: float = 1.0) -> float:
    """The cores one rank of a job takes on its host: one for each of its loader's workers, and
    its loop's share (a training loop's whole core; an emulated accelerator's
    accelerator.host_cpu, at least LOOP_MIN)."""
    return n_workers + max(LOOP_MIN, loop)


def ranks_that_fit(cores: float, n_workers: int, loop: float = 1.0) -> int:
    """How many such ranks `cores` cores hold, each with its workers and loop (at least one)."""
    return max(1, int(cores // cores_per_rank(n_workers, loop)))


def worker_cores(cores: float, ranks: int, loop: float = 1.0) -> float:
    """The cores left to the workers of `ranks` ranks once each rank's loop has its share."""
    return max(0.0, cores - ranks * max(LOOP_MIN, loop))


def _crowded(n_workers: int, ranks: int, cores: int, ranks_setting: str) -> str:
    """The warning for ranks x n_workers worker processes (and each rank's own loop) on too few
    cores, with the fix and its numbers. Each rank has its own n_workers, so where the ranks
    alone nearly fill the cores no n_workers helps: fewer ranks is the fix then."""
    ranks_fit = ranks_that_fit(cores, n_workers)
    # Named only from 1: n_workers=0 loads in each rank's loop.
    workers_fit = int(worker_cores(cores, ranks) // ranks)
    fewer_workers = f"n_workers={workers_fit}" if 1 <= workers_fit < n_workers else ""
    if ranks_setting:
        asked, fewer_ranks = f"{ranks_setting}={ranks}", f"{ranks_setting}={ranks_fit}"
    else:
        asked = f"{ranks} ranks on this host"
        fewer_ranks = (
            f"{ranks_fit} rank{'s' if ranks_fit > 1 else ''} (accelerators_per_host={ranks_fit}, "
            f"or torchrun --nproc_per_node={ranks_fit})"
        )
    # Emulated accelerators ask how many one host feeds: fewer is the answer. A torchrun job's
    # ranks are its GPUs, kept where fewer workers will do.
    if not fewer_workers:
        fix = f"Fewer ranks is the fix: {fewer_ranks} gives"
    elif ranks_setting == "accelerators_per_host":
        fix = f"Fewer ranks or workers is the fix: {fewer_ranks}, or {fewer_workers}, gives"
    else:
        fix = f"Fewer workers or ranks is the fix: {fewer_workers}, or {fewer_ranks}, gives"
    return (
        f"{asked} x n_workers={n_workers}: {ranks} x {n_workers} = {ranks * n_workers} worker "
        f"processes, and the {ranks} ranks' own loops, share {cores} cores, so each rank is "
        f"fed slower than it would be alone. {fix} each rank's loop and workers a core of "
        "their own"
    )


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may run on (taskset, cpusets)
    except AttributeError:
        return os.cpu_count() or 1


@cache
def _quota() -> cgroups.CpuQuota | None:
    # Read once per process: the quota of a running process's cgroup does not change under it,
    # and the worker-count hints ask often. (Memory is read afresh: it is what is left now.)
    return cgroups.cpu_quota()


def check_workers(
    loader: str,
    n_workers: int,
    per_worker: int,
    processes_per_machine: int = 1,
    enabled: bool = True,
    ranks_setting: str = "",
) -> None:
    """Refuse workers whose estimated memory exceeds what is available; warn beyond the cores.

    processes_per_machine: torchrun ranks on this machine, each with its own n_workers.
    ranks_setting: the setting that asked for those ranks ("accelerators_per_host"), named in
    the warning as its fix; "" for torchrun's own (--nproc_per_node).
    """
    if n_workers == 0:
        return
    total_workers = n_workers * processes_per_machine
    cores = usable_cores()
    if total_workers > cores:
        log.warning(
            "%s",
            _crowded(n_workers, processes_per_machine, cores, ranks_setting)
            if processes_per_machine > 1
            else f"n_workers={n_workers}: {n_workers} workers on {cores} cores share them; "
            f"measure fewer too (n_workers={cores} uses every core)",
        )
    if not enabled:
        return
    needed = total_workers * per_worker
    allowed = allowance()
    if needed > allowed.memory:
        fits = max(0, allowed.memory // max(per_worker, 1) // processes_per_machine)
        where = (
            f" ({allowed.memory_limit}, {gib(allowed.memory_in_use)} of it in use, page cache "
            "not counted)"
            if allowed.memory_limit
            else ""
        )
        more = (
            ", raise the limit (docker run --memory, a pod's limits.memory, SLURM's --mem, "
            "systemd's MemoryMax)"
            if allowed.memory_limit
            else ""
        )
        raise ConfigError(
            f"n_workers={n_workers}: {total_workers} workers of loader={loader} need about "
            f"{gib(needed)} ({per_worker / 2**20:,.0f} MiB each: the process, its prefetched "
            f"batches and what the loader holds), but {gib(allowed.memory)} are available"
            f"{where}. Use n_workers={fits} or fewer (or a smaller batch_size){more}, or "
            "resource_check=false to start them anyway"
        )
