"""What the process tree and the GPU did during an epoch.

CPU time and bytes read are counters: read at the start and the end of the epoch, over the main
process and every live descendant (Linux adds reaped children's counters to their parent's, so
workers that already exited still count). Memory and GPU utilization are levels: a background
thread samples them at `hz` (4 by default; NVML's utilization is itself an average over its last
sample period). The thread does a handful of /proc reads and NVML calls per sample, well under a
millisecond; bench/sampler_overhead.py measures that it does not slow the loop.

GPU metrics come from NVML, in-process, only for an NVIDIA device; elsewhere they are absent, not
zero.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil
import torch

from facebench.host.resources import usable_cpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Counters:
    cpu_s: float
    read_bytes: int | None  # None where the OS does not report it


def _tree() -> list[psutil.Process]:
    """This process and its descendants; fewer (or none) when they cannot be listed now: a
    process vanished mid-listing, or no file descriptor is left to read /proc with."""
    try:
        main = psutil.Process()
    except (psutil.Error, OSError):
        return []
    try:
        return [main, *main.children(recursive=True)]
    except (psutil.Error, OSError):
        return [main]


def read_counters(last: dict[int, Counters] | None = None) -> Counters:
    """CPU time and bytes read by this process and its descendants, summed.

    A process that ends between the listing and its read is left out: once reaped, its counters
    are in its parent's (the main process adds its children's). One that cannot be read for
    another reason (no file descriptor left, say) counts with its last counters in `last`, which
    this call updates for every process it reads.
    """
    last = {} if last is None else last
    tree = _tree()
    if not tree:  # nothing can be read now: the last counters stand
        reads = [c.read_bytes for c in last.values()]
        total_read = None if None in reads else sum(r for r in reads if r is not None)
        return Counters(sum(c.cpu_s for c in last.values()), total_read)
    cpu = 0.0
    read: int | None = 0
    for index, process in enumerate(tree):
        try:
            counters = _own_counters(process, with_children=index == 0)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # ended: its counters move to its parent
        except (psutil.Error, OSError, AttributeError, NotImplementedError):
            counters = last.get(process.pid)
            if counters is None:
                continue
        last[process.pid] = counters
        cpu += counters.cpu_s
        read = None if read is None or counters.read_bytes is None else read + counters.read_bytes
    return Counters(cpu, read)


def _own_counters(process: psutil.Process, with_children: bool) -> Counters:
    times = process.cpu_times()
    cpu = times.user + times.system
    if with_children:  # reaped children are folded into the main process's counters
        cpu += times.children_user + times.children_system
    try:
        read: int | None = process.io_counters().read_bytes
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        read = None  # not reported here
    return Counters(cpu, read)


def _gpu_handle(device: torch.device):
    """The NVML handle of a CUDA device, matched by UUID (CUDA_VISIBLE_DEVICES renumbers)."""
    import pynvml

    pynvml.nvmlInit()
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class UsageMonitor:
    """Samples process-tree memory and GPU utilization/memory on a daemon thread."""

    def __init__(self, device: torch.device, hz: float = 4.0) -> None:
        self.device = device
        self.period = 1.0 / hz if hz > 0 else 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rss_peak = 0
        self._used_start = 0
        self._used_peak = 0
        self._gpu_util: list[float] = []
        self._gpu_mem_peak = 0
        self._gpu = None
        self._start_counters: Counters | None = None
        self._last: dict[int, Counters] = {}  # each process's latest counters
        self._wall_start = 0.0
        self._loop_cpu_start = 0.0
        self._cpus = usable_cpus()  # a quota's 1.5 CPUs, not 2 cores

    def open_gpu(self) -> None:
        """Find the GPU in NVML (slow the first time): call before the epoch clock starts."""
        if self.device.type == "cuda":
            try:
                self._gpu = _gpu_handle(self.device)
            except Exception as error:  # no NVML library, driver mismatch, ...
                log.warning("GPU metrics unavailable: NVML failed (%s)", error)

    def start(self, wall_start: float) -> None:
        self._wall_start = wall_start
        self._loop_cpu_start = time.process_time()
        self._start_counters = read_counters(self._last)
        self._used_start = psutil.virtual_memory().used
        if self.period:
            self._sample()
            self._thread = threading.Thread(target=self._run, name="facebench-sampler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self) -> None:
        """One sample of the levels; a process that vanishes or cannot be read is skipped (a
        worker that just died, a process out of file descriptors), never raised from."""
        rss = 0
        for process in _tree():
            try:
                rss += process.memory_info().rss
            except (psutil.Error, OSError):
                continue
        self._rss_peak = max(self._rss_peak, rss)
        with contextlib.suppress(OSError):  # unreadable this time (no descriptor left)
            self._used_peak = max(self._used_peak, psutil.virtual_memory().used)
        if self._gpu is not None:
            import pynvml

            try:
                self._gpu_util.append(pynvml.nvmlDeviceGetUtilizationRates(self._gpu).gpu)
                used = pynvml.nvmlDeviceGetMemoryInfo(self._gpu).used
                self._gpu_mem_peak = max(self._gpu_mem_peak, used)
            except pynvml.NVMLError:
                pass

    def close(self) -> None:
        """Stop the thread (also after an error); idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            # RuntimeError: start() was interrupted (Ctrl-C) before it returned; it sees _stop.
            with contextlib.suppress(RuntimeError):
                thread.join()

    def stop(self, wall_end: float) -> dict[str, float]:
        """Metrics over the sampled span. Call while the loader's workers are still alive."""
        end_counters = read_counters(self._last)
        self._sample()
        self.close()
        elapsed = max(wall_end - self._wall_start, 1e-9)
        start = self._start_counters or end_counters
        metrics = {
            # Share of the CPU time this run may use (its cores, or a container's quota) used
            # by the process tree.
            "cpu_util_mean": 100.0 * (end_counters.cpu_s - start.cpu_s) / (elapsed * self._cpus),
            # Resident memory of the main process plus its workers. Pages a forked worker still
            # shares with the main process count in both, so this overstates many workers.
            "peak_rss_mb": self._rss_peak / 2**20,
            # The cores the loop's own process kept busy (all its threads, not its workers):
            # on a GPU's compute ceiling, the host CPU a training step costs (an emulated
            # accelerator's host_cpu; facebench.profile reads it).
            "loop_cpu_cores": (time.process_time() - self._loop_cpu_start) / elapsed,
            # Machine-wide memory in use, at its peak, over what was in use as the epoch began:
            # what the loader really added, shared pages counted once (other processes' changes
            # count too, so compare runs on a quiet machine).
            "peak_mem_added_mb": max(0, self._used_peak - self._used_start) / 2**20,
        }
        if start.read_bytes is not None and end_counters.read_bytes is not None:
            metrics["read_mb"] = (end_counters.read_bytes - start.read_bytes) / 2**20
        if self._gpu_util:
            metrics["gpu_util_mean"] = float(np.mean(self._gpu_util))
            metrics["gpu_util_p50"] = float(np.median(self._gpu_util))
            metrics["gpu_mem_peak_mb"] = self._gpu_mem_peak / 2**20
        return metrics
