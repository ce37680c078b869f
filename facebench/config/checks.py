"""The checks of a composed config that a type cannot make: one clear line per mistake, naming
the key (config/schema.py holds the schemas; Hydra checks types and choices as it composes), and
the checked config as the schemas' objects (`typed`)."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from facebench.config.prices import problems as price_problems
from facebench.config.schema import DistanceConfig
from facebench.errors import ConfigError

log = logging.getLogger(__name__)

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


SEED_RANGE = (0, 2**32 - 1)  # what numpy and torch accept as a seed


def unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Keys that no schema declares (Hydra's `+key=value` adds them without a check)."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []
    declared = {field.name for field in dataclasses.fields(schema)}
    found = []
    for key in node:
        if key not in declared:
            found.append(f"{prefix}{key}")
        elif isinstance(node[key], DictConfig):
            found += unknown_keys(node[key], f"{prefix}{key}.")
    return found


def _chosen_on_command_line(override: str) -> bool:
    """Whether this job's command line (or sweep) asked for `override` itself."""
    if not HydraConfig.initialized():
        return False
    return override in (item.replace(" ", "") for item in HydraConfig.get().overrides.task)


def _transform_problems(transform: DictConfig | None) -> list[str]:
    if transform is None:
        return []
    problems = []
    if transform.crop < 1 or transform.crop > transform.resize:
        problems.append(
            f"transform.crop={transform.crop}: must be from 1 to transform.resize "
            f"({transform.resize}): the crop is taken from the resized image"
        )
    for key in ("mean", "std"):
        values = list(transform[key])
        if len(values) != 3:
            problems.append(f"transform.{key}={values}: give one value per channel (R, G, B)")
        elif not all(math.isfinite(value) for value in values):
            problems.append(f"transform.{key}={values}: every value must be a finite number")
    if any(value <= 0 for value in transform.std):
        problems.append(f"transform.std={list(transform.std)}: every value must be above 0")
    return problems


def typed(cfg: DictConfig) -> Any:
    """The composed config, checked, as the objects of its schemas (TrainConfig, PrepareConfig
    or AdviseConfig, with the chosen loader's options class): what every job receives."""
    validate(cfg)
    return OmegaConf.to_object(cfg)


def validate(cfg: DictConfig) -> None:
    """Check the values a type cannot: one clear line per mistake, naming the key."""
    problems: list[str] = [
        f"{key}: no such key (check its spelling; `python train.py --cfg job` lists them all)"
        for key in unknown_keys(cfg)
    ]
    problems += _range_problems(cfg)
    problems += _transform_problems(cfg.get("transform"))
    problems += _mode_problems(cfg)
    problems += _data_problems(cfg.data)
    problems += _amount_problems(cfg)
    problems += _storage_problems(cfg.get("storage"))
    problems += price_problems(cfg.get("cost"), OmegaConf.select(cfg, "storage.name") or "local")
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))


def _amount_problems(cfg: DictConfig) -> list[str]:
    """advise's own amounts. (Names of loaders and shard formats are checked by their
    registries, where they are used: this layer imports none of facebench's.)"""
    problems = []
    for key in ("budget_s", "sample_images"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value <= 0:
            problems.append(f"{key}={value}: must be above 0")
    if any(count < 1 for count in OmegaConf.select(cfg, "workers") or []):
        problems.append(f"workers={list(cfg.workers)}: every worker count must be 1 or more")
    return problems


def _storage_problems(storage: DictConfig | None) -> list[str]:
    """A bucket's address and endpoint, in the forms the clients take."""
    if storage is None:
        return []
    if storage.get("name") == "local":
        emulated = [key for key in _DISTANCE if (storage.get(key) or 0) != 0]
        return [f"storage.{key}: a bucket's distance, for storage=s3 only" for key in emulated]
    problems = []
    url = storage.get("url") or ""
    if not _BUCKET_URL.match(url):
        problems.append(
            f"storage.url={url or '(empty)'}: give the data's place as s3://bucket/prefix "
            "(the prefix may be empty)"
        )
    endpoint = storage.get("endpoint") or ""
    if endpoint and not _ENDPOINT.match(endpoint):
        problems.append(
            f"storage.endpoint={endpoint}: give it as http://host:port or https://host "
            "(empty: AWS's own)"
        )
    emulated = [key for key in _DISTANCE if (storage.get(key) or 0) != 0]
    for key in emulated:
        if storage.get(key) < 0:
            problems.append(f"storage.{key}={storage.get(key)}: must be 0 (off) or more")
    p50, p99 = storage.get("latency_ms") or 0, storage.get("latency_p99_ms") or 0
    if p99 > 0 and p99 < p50:
        problems.append(
            f"storage.latency_p99_ms={p99}: below storage.latency_ms={p50}, the median; give a "
            "99th percentile at or above it, or 0 for a constant latency"
        )
    return problems


# A bucket's name as S3 allows it (3-63 lower-case letters, digits, dots, hyphens), then a prefix.
_BUCKET_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")
_ENDPOINT = re.compile(r"^https?://[^/\s]+/?$")
# storage.* keys of a bucket's distance: the schema's list, so a limit added there is checked.
_DISTANCE = tuple(field.name for field in dataclasses.fields(DistanceConfig))

_AT_LEAST_ONE = (
    "accelerators_per_host",
    "batch_size",
    "epochs",
    "repeat",
    "shard_size",
    "row_group_size",
    "loader.prefetch_factor",
    "storage.requests_per_worker",
    "storage.attempts",
    "loader.shuffle_buffer",
)


def _range_problems(cfg: DictConfig) -> list[str]:
    """Numbers outside what their key allows."""
    problems = []
    for key in _AT_LEAST_ONE:
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 1:
            problems.append(f"{key}={value}: must be at least 1")
    for key in ("n_workers", "max_batches", "data.max_pixels"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 0:
            problems.append(f"{key}={value}: must be 0 or more")
    for key in ("seed", "data.seed"):
        value = OmegaConf.select(cfg, key)
        if value is not None and not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
            problems.append(f"{key}={value}: use a seed from 0 to 2**32 - 1")
    device = OmegaConf.select(cfg, "device")
    if device is not None and not _DEVICE.match(device):
        problems.append(f"device={device}: use auto, cpu, cuda or cuda:N")
    accelerator_keys = ("images_per_s", "step_s", "step_batch", "measured_at")
    for key in (f"accelerator.{name}" for name in accelerator_keys):
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 0:
            problems.append(f"{key}={value:g}: must be 0 (not given) or more")
    min_au = OmegaConf.select(cfg, "accelerator.min_au")
    if min_au is not None and not 0 < min_au <= 1:
        problems.append(f"accelerator.min_au={min_au:g}: a share from 0 to 1 (0.90 is 90%)")
    host_cpu = OmegaConf.select(cfg, "accelerator.host_cpu")
    if host_cpu is not None and not 0 <= host_cpu <= 1:
        problems.append(
            f"accelerator.host_cpu={host_cpu:g}: the share of one core the training process "
            "keeps busy during a step, from 0 (idle) to 1 (a core spinning)"
        )
    queue = OmegaConf.select(cfg, "accelerator.queue")
    if queue is not None and queue < 1:
        problems.append(f"accelerator.queue={queue}: steps launched ahead, 1 or more")
    sample_hz = OmegaConf.select(cfg, "sample_hz")
    if sample_hz is not None and not 0 <= sample_hz <= 100:
        problems.append(f"sample_hz={sample_hz}: use 0 (off) to 100")
    return problems


def _mode_problems(cfg: DictConfig) -> list[str]:
    """Choices that contradict each other."""
    problems = []
    emulated = OmegaConf.select(cfg, "accelerator.name") not in (None, "none")
    if OmegaConf.select(cfg, "loader.name") == "ceiling" and cfg.model == "none" and not emulated:
        problems.append(
            "loader=ceiling with model=none measures nothing: it hands the same batch, already "
            "on the device, to no model. It is the compute ceiling: use it with a model"
        )
    accelerators = OmegaConf.select(cfg, "accelerators_per_host") or 1
    if accelerators > 1 and OmegaConf.select(cfg, "accelerator.name") in (None, "none"):
        problems.append(
            f"accelerators_per_host={accelerators} emulates that many accelerators; it "
            "needs one to emulate (accelerator=a100, h100 or custom). For real GPUs, start "
            "train.py with torchrun (docs/scaling.md)"
        )
    if OmegaConf.select(cfg, "loader.method") == "none":
        problems.append(
            "loader.method=none: this loader's workers run as processes or threads "
            "(loader.method=process or thread); n_workers=0 runs its work in the loop itself"
        )
    if OmegaConf.select(cfg, "host_only") and cfg.model != "none":
        problems.append(
            f"host_only=true measures the loader alone; it needs model=none (not model={cfg.model})"
        )
    return problems


def _data_problems(data: DictConfig) -> list[str]:
    """A data config that cannot be read as it stands."""
    problems = []
    if data.name == "synthetic" and data.n_images < 1:
        problems.append(f"data.n_images={data.n_images}: the synthetic set needs at least 1 image")
    if data.name == "synthetic" and data.root:
        ignored = (
            f"data.root={data.root}: data=synthetic generates its own images and would ignore it"
        )
        if _chosen_on_command_line("data=synthetic"):  # a sweep over data=synthetic,<real>
            log.warning("%s", ignored)
        else:
            problems.append(f"{ignored}; add data=folder (or data=celeba_digiface) to read it")
    if data.name != "synthetic" and not data.root:
        holding = "one folder per class" if data.layout == "folder" else "CelebA/ and DigiFace1M/"
        problems.append(
            f"data.root is empty: data={data.name} reads a real dataset; "
            f"pass data.root=/path/to/the/folder that holds {holding}"
        )
    if data.labels and data.layout != "folder":
        problems.append(
            f"data.labels={data.labels}: a labels CSV is read with data=folder (layout=folder); "
            "CelebA's labels come from identity_CelebA.txt"
        )
    return problems
