"""Choosing the device and the mixed-precision mode, and reading the clock honestly."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from facebench.config import Amp, choice
from facebench.errors import ConfigError
from facebench.resources import usable_cores


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
        return torch.device("cuda", index)
    return device


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
    """What identifies the hardware a run measured: CPU model and cores, GPUs and driver."""
    tags = {
        "device_name": device_name(device),
        "cpu": cpu_model(),
        "cpu_cores": str(usable_cores()),
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


def resolve_precision(mode: str, device: torch.device) -> Precision:
    """auto: fp16 with GradScaler on CUDA (as the article), bf16 on CPU (fp16 there is slow)."""
    mode = choice(Amp, mode, "amp")
    if mode == Amp.auto:
        mode = Amp.fp16 if device.type == "cuda" else Amp.bf16
    if mode == Amp.fp16:
        return Precision("fp16", torch.float16, scale_loss=True)
    if mode == Amp.bf16:
        return Precision("bf16", torch.bfloat16, scale_loss=False)
    return Precision("fp32", None, scale_loss=False)
