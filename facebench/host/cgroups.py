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
    # Bytes in use less the page cache of files (active and inactive), which the kernel reclaims
    # before it kills. Shared memory (/dev/shm) is not page cache of files and stays counted.
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
    """How many processes the kernel's OOM killer has killed in this process's own memory
    cgroup since it was made (v1 memory.oom_control; v2 memory.events.local, or memory.events,
    which also counts the cgroup's children), or 0 where that is not recorded."""
    for version, folder in _own_cgroups(root, "memory"):
        names = ["memory.oom_control"] if version == 1 else ["memory.events.local", "memory.events"]
        for name in names:
            counts = _keyed(folder[0] / name)
            if "oom_kill" in counts:
                return counts["oom_kill"]
    return 0


def memory_cgroup(root: Path = Path("/")) -> str:
    """This process's own memory cgroup, as a folder (what `oom_kills` counts in), or ""."""
    for _, folder in _own_cgroups(root, "memory"):
        return str(folder[0])
    return ""


def _own_cgroups(root: Path, controller: str) -> list[tuple[int, list[Path]]]:
    """For each hierarchy that holds `controller`: its version, and the folders from this
    process's cgroup up to the mount's root."""
    try:
        # surrogateescape: a mount point's name may be any bytes.
        memberships = (root / "proc/self/cgroup").read_text(errors="surrogateescape").splitlines()
        mounts = (root / "proc/self/mountinfo").read_text(errors="surrogateescape").splitlines()
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
        mount = _mount(mounts, version, controller, cgroup)
        if mount is None:
            continue
        relative, mount_point = mount
        top = root / mount_point.lstrip("/")
        folder = top / relative
        levels = [folder, *(parent for parent in folder.parents if parent.is_relative_to(top))]
        found.append((version, levels))
    return found


def _mount(mounts: list[str], version: int, controller: str, cgroup: str) -> tuple[str, str] | None:
    """(the cgroup's folder below the mount point, the mount point) of the hierarchy's mount
    that holds the cgroup: a container's mount shows its own cgroup as the root (mount root
    /docker/<id>, cgroup /docker/<id>: the folder is the mount point). Of several, the last:
    a later mount on the same place hides an earlier one (a host's tree bind-mounted over a
    container's). None where no mount holds it (a cgroup outside this namespace's view)."""
    path = PurePosixPath(cgroup)
    if ".." in path.parts:
        return None  # above this cgroup namespace's root: not in any mount seen from here
    found = None
    for line in mounts:
        head, _, tail = line.partition(" - ")
        fields, described = head.split(), tail.split()
        if len(fields) < 5 or len(described) < 3:
            continue
        fstype, options = described[0], described[2].split(",")
        if not (
            (version == 2 and fstype == "cgroup2")
            or (version == 1 and fstype == "cgroup" and controller in options)
        ):
            continue
        base = PurePosixPath(_unescape(fields[3]))
        if path.is_relative_to(base):
            found = str(path.relative_to(base)), _unescape(fields[4])
    return found


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
    cache = stat.get("total_inactive_file", 0) + stat.get("total_active_file", 0)
    return MemoryLimit(folder, limit, max(0, usage - cache))


def _v2_memory(folder: Path) -> MemoryLimit | None:
    limit = _number(folder / "memory.max")
    if limit is None or limit >= _UNLIMITED:
        return None
    usage = _number(folder / "memory.current") or 0
    stat = _keyed(folder / "memory.stat")
    cache = stat.get("inactive_file", 0) + stat.get("active_file", 0)
    return MemoryLimit(folder, limit, max(0, usage - cache))


def _v1_cpu(folder: Path) -> CpuQuota | None:
    quota, period = _number(folder / "cpu.cfs_quota_us"), _number(folder / "cpu.cfs_period_us")
    if quota is None or period is None or quota <= 0 or period <= 0:  # -1: no quota
        return None
    return CpuQuota(folder, quota / period)


def _v2_cpu(folder: Path) -> CpuQuota | None:
    try:
        quota, period = (folder / "cpu.max").read_text(errors="replace").split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return CpuQuota(folder, int(quota) / int(period))


def _number(path: Path) -> int | None:
    """A file holding one integer; None where it is missing, unreadable or "max"."""
    try:
        return int(path.read_text(errors="replace").strip())
    except (OSError, ValueError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    """A file of "key value" lines (memory.stat, memory.events)."""
    values = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return values
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values
