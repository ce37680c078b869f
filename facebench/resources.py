"""Will the requested workers fit this machine? Asked before any worker is forked.

A thousand workers fork a thousand processes and take the machine's memory down with them (and
leave the MLflow run RUNNING). Each worker costs its own memory (a forked process's pages that
stop being shared, about 20-40 MB measured here, counted as 64 MB), the batches it keeps ready
in shared memory (prefetch_factor of them), and whatever its loader holds (a pickle shard, a
shuffle buffer). A request whose estimate exceeds the memory available is refused with the
numbers; `resource_check=false` starts it anyway. More workers than cores only warns: the
article ran 10 workers, and that is a legitimate thing to measure.
"""

from __future__ import annotations

import logging
import os
import warnings

import psutil

from facebench.errors import ConfigError

log = logging.getLogger(__name__)

WORKER_OWN_BYTES = 64 * 2**20
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


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may run on (taskset, cpusets)
    except AttributeError:
        return os.cpu_count() or 1


def check_workers(
    loader: str,
    n_workers: int,
    per_worker: int,
    processes_per_machine: int = 1,
    enabled: bool = True,
) -> None:
    """Refuse workers whose estimated memory exceeds what is available; warn beyond the cores.

    processes_per_machine: torchrun ranks on this machine, each with its own n_workers.
    """
    if n_workers == 0:
        return
    total_workers = n_workers * processes_per_machine
    cores = usable_cores()
    if total_workers > cores:
        log.warning(
            "n_workers=%d%s: %d workers on %d cores share them; measure fewer too "
            "(n_workers=%d uses every core)",
            n_workers,
            f" x {processes_per_machine} ranks" if processes_per_machine > 1 else "",
            total_workers,
            cores,
            max(1, cores // processes_per_machine),
        )
    if not enabled:
        return
    needed = total_workers * per_worker
    available = psutil.virtual_memory().available
    if needed > available:
        fits = max(0, available // max(per_worker, 1) // processes_per_machine)
        raise ConfigError(
            f"n_workers={n_workers}: {total_workers} workers of loader={loader} need about "
            f"{needed / 2**30:.1f} GiB ({per_worker / 2**20:,.0f} MiB each: the process, its "
            f"prefetched batches and what the loader holds), but {available / 2**30:.1f} GiB are "
            f"available. Use n_workers={fits} or fewer (or a smaller batch_size), or "
            "resource_check=false to start them anyway"
        )
