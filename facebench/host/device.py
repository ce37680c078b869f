"""Choosing the device and the mixed-precision mode, and reading the clock honestly."""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from facebench.config import Amp, choice
from facebench.errors import ConfigError
from facebench.host.resources import allowance

log = logging.getLogger(__name__)


def resolve_device(requested: str, local_rank: int = 0, distributed: bool = False) -> torch.device:
    """auto -> a CUDA device when there is one, else the CPU. Under torchrun, `cuda` and `auto`
    mean this process's own GPU, cuda:LOCAL_RANK."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if distributed and device.type == "cuda" and device.index is not None:
        raise ConfigError(
            f"device={requested}: under torchrun every rank uses its own GPU (cuda:LOCAL_RANK); "
            "use device=cuda or auto"
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={requested}: no CUDA device here; use device=cpu or auto")
        index = device.index if device.index is not None else local_rank
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={requested}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
        _cuda_schedule(index)
        return torch.device("cuda", index)
    return device


# How CUDA's runtime waits for the GPU (cudaSetDeviceFlags' scheduling flags): unset, CUDA's
# default (auto: it spins while the host has more cores than CUDA contexts). bench/gpu_check.py
# measures a training step's host CPU under the default and under blocking_sync.
CUDA_SCHEDULE_ENV = "FACEBENCH_CUDA_SCHEDULE"
_SCHEDULES = {"auto": 0, "spin": 1, "yield": 2, "blocking_sync": 4}


def _cuda_schedule(index: int) -> None:
    """Apply $FACEBENCH_CUDA_SCHEDULE to this GPU's primary context (the one torch uses),
    through the driver, which sets it whether or not the context exists yet."""
    asked = os.environ.get(CUDA_SCHEDULE_ENV, "")
    if not asked:
        return
    if asked not in _SCHEDULES:
        raise ConfigError(f"{CUDA_SCHEDULE_ENV}={asked}: use one of {', '.join(_SCHEDULES)}")
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise ConfigError(f"{CUDA_SCHEDULE_ENV}={asked}: no CUDA driver ({error})") from None
    handle = ctypes.c_int()
    error = (
        driver.cuInit(0)
        or driver.cuDeviceGet(ctypes.byref(handle), index)
        or driver.cuDevicePrimaryCtxSetFlags(handle, _SCHEDULES[asked])
    )
    if error:
        raise ConfigError(
            f"{CUDA_SCHEDULE_ENV}={asked}: the CUDA driver refused it (CUresult {error}); "
            f"unset {CUDA_SCHEDULE_ENV}"
        )
    log.info("CUDA waits for cuda:%d with its %s scheduling", index, asked)


def cpu_model() -> str:
    """The processor's name as the kernel reports it ('AMD EPYC 7B13'), or the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def hardware_tags(device: torch.device) -> dict[str, str]:
    """What identifies the hardware a run measured: CPU model and the cores it may use, the
    container limits that applied (if any), GPUs and driver."""
    allowed = allowance()
    tags = {
        "device_name": device_name(device),
        "cpu": cpu_model(),
        "cpu_cores": str(allowed.cores),
        **allowed.tags(),
        "gpu": "none",
        "gpu_count": "0",
    }
    if torch.cuda.is_available():
        tags["gpu"] = torch.cuda.get_device_name(0)
        tags["gpu_count"] = str(torch.cuda.device_count())
        tags["cuda"] = str(torch.version.cuda)
        try:
            import pynvml

            pynvml.nvmlInit()
            tags["gpu_driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # no NVML library: the driver goes unnamed
            pass
    return tags


def threads_within_quota() -> None:
    """torch sizes its CPU thread pool by the host's cores; under a container's CPU quota that
    many threads only take turns (and are throttled together). Fewer, as many as the quota's
    cores, unless OMP_NUM_THREADS says otherwise."""
    allowed = allowance()
    if (
        allowed.cores_limit
        and "OMP_NUM_THREADS" not in os.environ
        and torch.get_num_threads() > allowed.cores
    ):
        log.info("torch threads: %d, for the %s", allowed.cores, allowed.cores_limit)
        torch.set_num_threads(allowed.cores)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that a clock read afterwards means what it says."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


@dataclass(frozen=True)
class Precision:
    """How the forward pass runs: an autocast dtype (or none), and whether to scale the loss."""

    name: str  # fp16 | bf16 | fp32
    dtype: torch.dtype | None
    scale_loss: bool
    reason: str = ""  # why this precision, for the log and the run's params

    def describe(self) -> str:
        return f"{self.name} ({self.reason})" if self.reason else self.name


FP16 = Precision("fp16", torch.float16, scale_loss=True)
BF16 = Precision("bf16", torch.bfloat16, scale_loss=False)
FP32 = Precision("fp32", None, scale_loss=False)


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX) and oneDNN uses it.

    Elsewhere (AVX2 machines, most cloud CPUs before 2023) bf16 autocast is emulated: measured on
    one, a ResNet-50 training step ran about 15 times slower in bf16 than in fp32. Both checks are
    private to torch; a torch without them is taken to have no native bfloat16.
    """
    try:
        hardware = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return bool(hardware and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_precision(mode: str, device: torch.device) -> Precision:
    """auto: fp16 with GradScaler on CUDA (as the article), bf16 on a CPU that computes it
    natively, fp32 on any other CPU. An explicit mode is obeyed, with a warning where bf16 would
    be emulated."""
    mode = choice(Amp, mode, "amp")
    cpu = device.type == "cpu"
    native = native_bf16() if cpu else True
    if mode == Amp.auto:
        if not cpu:
            return replace(FP16, reason=f"amp=auto on {device.type}: fp16 with GradScaler")
        if native:
            return replace(BF16, reason="amp=auto: this CPU computes bfloat16 natively")
        return replace(
            FP32,
            reason="amp=auto: this CPU has no native bfloat16, which would be emulated about 10x "
            "slower; amp=bf16 forces it",
        )
    if mode == Amp.bf16 and cpu and not native:
        log.warning(
            "amp=bf16 on a CPU without native bfloat16: emulated, about 10x slower than amp=off"
        )
        return replace(BF16, reason="amp=bf16, emulated on this CPU")
    chosen = {Amp.fp16: FP16, Amp.bf16: BF16, Amp.off: FP32}[mode]
    return replace(chosen, reason=f"amp={mode.value}")
