"""The limits a container puts on this process, read from its control groups (cgroup v1 and v2).

`docker run --memory=2.5g --cpus=2`, a Kubernetes pod's limits and SLURM's task plugin all work
through cgroups, not through what psutil or os.cpu_count() see: those report the host. A memory
limit is enforced by the kernel's OOM killer (SIGKILL, no message); a CPU quota by throttling.

Every cgroup from this process's own up to the root of its mount applies (a pod's limit above a
container's, say), so each level is read and the tightest wins. Both hierarchies are read where
both are mounted (a hybrid host's v1 controllers beside an empty v2 tree): a file that is not
there is a limit that is not set.

Everything is read under `root` ("/" on a real machine), so tests can hand it a fake tree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# cgroup v1 writes "no limit" as LONG_MAX rounded down to a page (9223372036854771712); nothing
# real comes near 2**62 bytes.
_UNLIMITED = 2**62
_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


@dataclass(frozen=True)
class MemoryLimit:
    """One cgroup's memory limit and what its processes already use of it."""

    path: Path  # the cgroup's folder, named in messages
    limit: int  # bytes
    # Bytes in use that cannot be reclaimed: usage less the inactive page cache (what the kernel
    # drops before it kills; the working set, as Kubernetes counts it).
    used: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)


@dataclass(frozen=True)
class CpuQuota:
    """One cgroup's CPU quota: `cpus` CPUs' worth of time per period."""

    path: Path
    cpus: float

    @property
    def cores(self) -> int:
        """Whole cores: a fractional quota counts as the next whole one (1.5 CPUs of time keep
        two processes busy, throttled to 1.5 between them), never fewer than one."""
        return max(1, math.ceil(self.cpus - 1e-9))


def memory_limits(root: Path = Path("/")) -> list[MemoryLimit]:
    """Every memory limit set on this process's cgroups, v1 and v2, innermost first."""
    limits = []
    for version, folder in _own_cgroups(root, "memory"):
        read = _v1_memory if version == 1 else _v2_memory
        limits.extend(limit for limit in map(read, folder) if limit is not None)
    return limits


def tightest_memory(root: Path = Path("/")) -> MemoryLimit | None:
    """The limit that leaves this process the least memory, or None where no cgroup sets one."""
    return min(memory_limits(root), key=lambda limit: limit.free, default=None)


def cpu_quota(root: Path = Path("/")) -> CpuQuota | None:
    """The tightest CPU quota set on this process's cgroups, v1 and v2, or None."""
    quotas = []
    for version, folder in _own_cgroups(root, "cpu"):
        read = _v1_cpu if version == 1 else _v2_cpu
        quotas.extend(quota for quota in map(read, folder) if quota is not None)
    return min(quotas, key=lambda quota: quota.cpus, default=None)


def oom_kills(root: Path = Path("/")) -> int:
    """How many processes the kernel's OOM killer has killed in this process's cgroups (v1
    memory.oom_control, v2 memory.events), or 0 where that is not recorded."""
    total = 0
    for version, folder in _own_cgroups(root, "memory"):
        name = "memory.oom_control" if version == 1 else "memory.events"
        for level in folder:
            total += _keyed(level / name).get("oom_kill", 0)
    return total


def _own_cgroups(root: Path, controller: str) -> list[tuple[int, list[Path]]]:
    """For each hierarchy that holds `controller`: its version, and the folders from this
    process's cgroup up to the mount's root."""
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:  # not Linux, or /proc not mounted: no cgroup to read
        return []
    found = []
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, cgroup = parts
        version = 2 if controllers == "" else 1
        if version == 1 and controller not in controllers.split(","):
            continue
        mount = _mount(mounts, version, controller)
        if mount is None:
            continue
        mount_root, mount_point = mount
        folder = root / mount_point.lstrip("/") / _relative(cgroup, mount_root)
        top = root / mount_point.lstrip("/")
        levels = [folder, *(parent for parent in folder.parents if parent.is_relative_to(top))]
        found.append((version, levels))
    return found


def _mount(mounts: list[str], version: int, controller: str) -> tuple[str, str] | None:
    """(the mount's root within the hierarchy, where it is mounted) for the hierarchy."""
    for line in mounts:
        head, _, tail = line.partition(" - ")
        fields, described = head.split(), tail.split()
        if len(fields) < 5 or len(described) < 3:
            continue
        fstype, options = described[0], described[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (
            version == 1 and fstype == "cgroup" and controller in options
        ):
            return _unescape(fields[3]), _unescape(fields[4])
    return None


def _relative(cgroup: str, mount_root: str) -> str:
    """The cgroup's folder below the mount point. A container's mount shows its own cgroup as
    the root (mount root /docker/<id>, cgroup /docker/<id>): its folder is the mount point. Under
    a cgroup namespace the path is already relative to what is mounted."""
    path, base = PurePosixPath(cgroup), PurePosixPath(mount_root)
    if path.is_relative_to(base):
        return str(path.relative_to(base))
    return str(path).lstrip("/")


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


def _v1_memory(folder: Path) -> MemoryLimit | None:
    limits = [_number(folder / "memory.limit_in_bytes")]
    stat = _keyed(folder / "memory.stat")
    # The limit of every ancestor, as the kernel applies it: seen even where a container's
    # mount shows only its own cgroup.
    limits.append(stat.get("hierarchical_memory_limit"))
    limit = min((value for value in limits if value is not None), default=None)
    if limit is None or limit >= _UNLIMITED:
        return None
    usage = _number(folder / "memory.usage_in_bytes") or 0
    return MemoryLimit(folder, limit, max(0, usage - stat.get("total_inactive_file", 0)))


def _v2_memory(folder: Path) -> MemoryLimit | None:
    limit = _number(folder / "memory.max")
    if limit is None or limit >= _UNLIMITED:
        return None
    usage = _number(folder / "memory.current") or 0
    inactive = _keyed(folder / "memory.stat").get("inactive_file", 0)
    return MemoryLimit(folder, limit, max(0, usage - inactive))


def _v1_cpu(folder: Path) -> CpuQuota | None:
    quota, period = _number(folder / "cpu.cfs_quota_us"), _number(folder / "cpu.cfs_period_us")
    if quota is None or period is None or quota <= 0 or period <= 0:  # -1: no quota
        return None
    return CpuQuota(folder, quota / period)


def _v2_cpu(folder: Path) -> CpuQuota | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return CpuQuota(folder, int(quota) / int(period))


def _number(path: Path) -> int | None:
    """A file holding one integer; None where it is missing, unreadable or "max"."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    """A file of "key value" lines (memory.stat, memory.events)."""
    values = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values
