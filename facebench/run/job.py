"""Where and how one job runs: its place in a torchrun job, its device and precision, and how
its MLflow run is named, described and tagged."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from facebench import loaders
from facebench.config import TrainConfig
from facebench.data.records import LabelSpace
from facebench.host.device import (
    Precision,
    hardware_tags,
    resolve_device,
    resolve_precision,
    threads_within_quota,
)
from facebench.host.distributed import World, world_from_env
from facebench.host.distributed import start as start_distributed
from facebench.host.paths import PROJECT_ROOT
from facebench.run.accelerator import Accelerator
from facebench.run.training import Trainer, build_trainer


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'loader': {'name': 'x'}} -> {'loader.name': 'x'}, for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def git_commit() -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() or "unknown"


def run_name(cfg: TrainConfig, precision: str) -> str:
    """dataset-w5-bs600-fp16; the decoder is named when it is not the loader's default
    (dataset-fast-w5-bs600-fp16), loader=custom's target (custom-ShopImages-w5-...), the model
    when it is not the article's ResNet-50, an emulated accelerator in its place
    (dataset-w5-bs600-h100)."""
    decoder = _chosen_decoder(cfg) or _own_target(cfg)
    loader = f"{cfg.loader.name}-{decoder}" if decoder else cfg.loader.name
    name = f"{loader}-w{cfg.n_workers}-bs{cfg.batch_size}"
    if cfg.accelerator.name != "none":
        return f"{name}-{cfg.accelerator.name}"
    if cfg.model == "none":
        return f"{name}-host-only" if cfg.host_only else f"{name}-loader-only"
    name = f"{name}-{precision}"
    return name if cfg.model == "resnet50" else f"{name}-{cfg.model}"


def _own_target(cfg: TrainConfig) -> str:
    """loader=custom's target, by its last name (custom-shop_images-w2-...): runs of two
    pipelines would otherwise share a name. A loader of the user's own config folder is named
    by its file already."""
    dataset = getattr(cfg.loader, "dataset", None)
    if cfg.loader.name != "custom" or not dataset:
        return ""
    return str(dataset.get("_target_", "")).rpartition(".")[2]


def _chosen_decoder(cfg: TrainConfig) -> str:
    """loader.decoder where the run chose one other than its loader's default (the loader's
    options schema, from the registry), else "": runs that differ only in their decoder would
    otherwise share a name."""
    chosen = getattr(cfg.loader, "decoder", None)
    if chosen is None:  # a loader that decodes nothing (raw, pickle, ceiling, ...)
        return ""
    schema = {
        field.name: field for field in dataclasses.fields(loaders.get(cfg.loader.name).options)
    }
    default = schema["decoder"].default if "decoder" in schema else None
    return "" if str(chosen) == str(default) else str(chosen)


@dataclass(frozen=True)
class Job:
    world: World
    device: torch.device
    precision: Precision
    # An emulated accelerator in place of the model (facebench/run/accelerator.py), or None.
    accelerator: Accelerator | None = None

    @classmethod
    def start(cls, cfg: TrainConfig) -> Job:
        accelerator = Accelerator.of(cfg.accelerator, cfg.transform.crop, cfg.batch_size)
        world = world_from_env()
        # An emulated accelerator trains nothing on a device: with device=auto its ranks take no
        # GPU (a host with fewer GPUs than accelerators_per_host emulates as many).
        asked = "cpu" if accelerator is not None and cfg.device == "auto" else cfg.device
        device = resolve_device(asked, world.local_rank, world.distributed)
        threads_within_quota()
        start_distributed(world, device)
        return cls(world, device, resolve_precision(cfg.amp, device), accelerator)

    def trainer(self, cfg: TrainConfig, labels: LabelSpace) -> Trainer | None:
        """The configured model's training step on this job's device and precision; None for
        model=none (the loader alone) and for an emulated accelerator (its step is a wait)."""
        if cfg.model == "none" or self.accelerator is not None:
            return None
        return build_trainer(
            cfg.model,
            labels.n_classes,
            self.device,
            self.precision,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            distributed=self.world.distributed,
        )

    def name(self, cfg: TrainConfig) -> str:
        name = run_name(cfg, self.precision.name)
        return f"{name}-x{self.world.world_size}" if self.world.distributed else name

    def params(self, cfg: TrainConfig) -> dict[str, Any]:
        """The whole config, flattened (`loader.crop`), and what this job resolved it to."""
        params: dict[str, Any] = flatten(dataclasses.asdict(cfg))
        params.update(
            loader=cfg.loader.name,
            data=cfg.data.name,
            model=cfg.model,
            amp_resolved=self.precision.name,  # `amp` is what was asked (auto, say)
            amp_reason=self.precision.reason,
            device_type=self.device.type,
            world_size=self.world.world_size,
        )
        if self.accelerator is not None:
            params.update(self.accelerator.params())
        return params

    def tags(self, sweep_id: str | None) -> dict[str, str]:
        tags = {
            **hardware_tags(self.device),
            "torch_version": torch.__version__,
            "git_commit": git_commit(),
        }
        if sweep_id:
            tags["sweep_id"] = sweep_id
        return tags
