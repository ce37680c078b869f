"""Slower storage, emulated: the block device that holds a folder, throttled for this process and
every process it starts, with the kernel's block I/O controller (cgroup v2 `io.max`, or cgroup v1
`blkio.throttle.*`). Needs root and a mounted controller; `SlowStorage.open` says why not
otherwise, and the benchmarks print that instead of the rows it would have measured.

Only reads that reach the device are throttled: run with cache=cold (or after evicting the
files) for them to count, as the first run after a reboot would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1_BLKIO = Path("/sys/fs/cgroup/blkio")
_NAME = "facebench-slow-storage"


def block_device(folder: Path) -> str:
    """'major:minor' of the whole disk that holds `folder` (a partition's parent)."""
    device = os.stat(folder).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    if (sysfs / "partition").is_file():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{os.major(device)}:{os.minor(device)}"


@dataclass
class SlowStorage:
    """A cgroup whose reads from one device are limited to `iops` and `bytes_per_s`."""

    group: Path
    leave_to: Path  # the cgroup.procs file that takes a process back out
    device: str
    iops: int
    bytes_per_s: int

    @classmethod
    def open(cls, folder: Path, iops: int, bytes_per_s: int) -> SlowStorage | str:
        """The throttled group, or why it cannot be made here (a sentence)."""
        if os.geteuid() != 0:
            return "needs root to create a cgroup"
        try:
            device = block_device(folder)
        except OSError as error:
            return f"cannot find the block device of {folder} ({error})"
        controllers = V2 / "cgroup.controllers"
        try:
            if controllers.is_file() and "io" in controllers.read_text().split():
                group = V2 / _NAME
                group.mkdir(exist_ok=True)
                (group / "io.max").write_text(f"{device} riops={iops} rbps={bytes_per_s}\n")
                return cls(group, V2 / "cgroup.procs", device, iops, bytes_per_s)
            if (V1_BLKIO / "blkio.throttle.read_iops_device").is_file():
                group = V1_BLKIO / _NAME
                group.mkdir(exist_ok=True)
                (group / "blkio.throttle.read_iops_device").write_text(f"{device} {iops}\n")
                (group / "blkio.throttle.read_bps_device").write_text(f"{device} {bytes_per_s}\n")
                return cls(group, V1_BLKIO / "cgroup.procs", device, iops, bytes_per_s)
        except OSError as error:
            return f"the block I/O controller refused the limits ({error})"
        return "no cgroup v2 io controller and no cgroup v1 blkio throttle on this machine"

    def describe(self) -> str:
        kind = "io.max" if self.group.parent == V2 else "blkio.throttle"
        return (
            f"reads from device {self.device} limited to {self.iops:,} IOPS and "
            f"{self.bytes_per_s / 1e6:,.0f} MB/s (cgroup {kind})"
        )

    @contextmanager
    def applied(self) -> Iterator[None]:
        """This process, and every process it starts meanwhile, in the throttled group."""
        (self.group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        try:
            yield
        finally:
            self.leave_to.write_text(f"{os.getpid()}\n")
