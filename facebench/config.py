"""Typed schemas behind every Hydra config group.

Each YAML option under conf/ names its schema in its own defaults list, so a typo, a wrong type
or a value outside a key's choices (`n_workers=abc`, `amp=fp8`, `cache=hot`) fails when the config
is composed, before any work. Every key with fixed choices has them here, once, as an Enum. Values
that a type cannot express (`batch_size=0`) are checked by `validate`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from facebench.data.images import DEFAULT_MAX_PIXELS
from facebench.errors import ConfigError

log = logging.getLogger(__name__)


class Model(StrEnum):
    resnet50 = "resnet50"  # the article's
    resnet18 = "resnet18"
    none = "none"  # no model: the loader alone (with host_only, its host side alone)


class Amp(StrEnum):
    # fp16 + GradScaler on CUDA (the article's); bf16 on a CPU that has it natively, else fp32
    auto = "auto"
    fp16 = "fp16"
    bf16 = "bf16"
    off = "off"  # fp32


class Crop(StrEnum):
    random = "random"  # the article's RandomCrop(100)
    center = "center"  # deterministic: every loader delivers the same pixels (tests)


class CacheMode(StrEnum):
    warm = "warm"  # the epoch's files read into the page cache first
    cold = "cold"  # evicted first
    keep = "keep"  # as found


# raise: stop, naming the file; skip: leave it out of every loader alike, and count it. (Built
# by call: `raise` cannot be a member's name in a class body, and OmegaConf matches names.)
OnBadSample = StrEnum("OnBadSample", {"raise": "raise", "skip": "skip"})


class Decoder(StrEnum):
    torchvision = "torchvision"  # torchvision.io and batched tensor transforms
    pil = "pil"  # the article's PIL transform, per sample


class WorkerKind(StrEnum):
    process = "process"
    thread = "thread"


class DataLayout(StrEnum):
    faces = "faces"  # CelebA/ + DigiFace1M/ in their published layouts
    folder = "folder"  # one folder per class (ImageFolder's layout), or a labels CSV


E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], value: str, key: str) -> E:
    """`value` as one of `kind`'s choices, for callers that bypass Hydra's composition."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ConfigError(f"{key}={value}: use one of {allowed}") from None


@dataclass
class DataConfig:
    name: str = MISSING
    # How data.root is laid out: faces (CelebA/ + DigiFace1M/) or folder (one folder per class).
    # The synthetic stand-in is generated in either.
    layout: DataLayout = DataLayout.faces
    # The data's folder. Empty for the synthetic stand-in, which lives in the cache folder.
    root: str = ""
    # layout=folder: a "path,label" CSV (relative to data.root, or absolute) instead of class
    # folders.
    labels: str = ""
    # Synthetic stand-in only: how many images to generate (22% CelebA-like, 78% DigiFace-like).
    n_images: int = 0
    # Synthetic stand-in only: the generator's seed (the training seed is the top-level `seed`).
    seed: int = 0
    # Where generated data and shards go; empty means <project root>/.cache.
    cache_dir: str = ""
    # The largest image, in pixels, that is decoded (read from its header first): a larger one
    # is a bad sample (on_bad_sample). 0 lifts the limit.
    max_pixels: int = DEFAULT_MAX_PIXELS


@dataclass
class LoaderConfig:
    """Options every loader understands; a loader with more subclasses this in its module."""

    name: str = MISSING
    crop: Crop = Crop.random
    # Batches each DataLoader worker keeps ready; torch's default is 2.
    prefetch_factor: int = 2


@dataclass
class TransformConfig:
    """Preprocessing geometry: Resize((resize, resize)) -> crop x crop -> Normalize(mean, std)."""

    resize: int = 112  # both sides: any image becomes a resize x resize square
    crop: int = 100  # the random (or center) crop's side
    mean: list[float] = dataclasses.field(default_factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = dataclasses.field(default_factory=lambda: [0.229, 0.224, 0.225])


@dataclass
class CommonConfig:
    """Keys that train.py and prepare.py share, so the same overrides mean the same thing."""

    data: DataConfig = MISSING
    # DataLoader workers in train.py; decoding processes in prepare.py.
    n_workers: int = 5
    seed: int = 0
    # Samples per shard (the article used 10,000).
    shard_size: int = 10_000
    # Where shards are written and read; empty means <data folder>/facebench-shards.
    shards_dir: str = ""
    # A file that is missing, empty or does not decode: raise (stop, naming it) or skip (leave it
    # out of every loader alike, and count it).
    on_bad_sample: OnBadSample = OnBadSample("raise")
    # Resize, crop and normalization; shards that hold resized pixels (raw, litdata) follow it.
    transform: TransformConfig = dataclasses.field(default_factory=TransformConfig)


@dataclass
class TrainConfig(CommonConfig):
    loader: LoaderConfig = MISSING
    model: Model = Model.resnet50
    # Mixed precision of the forward pass.
    amp: Amp = Amp.auto
    batch_size: int = 600
    epochs: int = 1
    # 0 runs the whole epoch; N stops each epoch after N batches.
    max_batches: int = 0
    # auto | cpu | cuda | cuda:N
    device: str = "auto"
    # Page cache before each epoch: warm (files read in first), cold (evicted), keep (as found).
    cache: CacheMode = CacheMode.warm
    # Measure the whole run (all epochs) this many times in one job.
    repeat: int = 1
    # Resource samples per second (memory, GPU); 0 samples only at the start and end of an epoch.
    sample_hz: float = 4.0
    # Hash every shard against its manifest before the epoch (pickle shards are always hashed
    # before they are unpickled; raw and tar are otherwise checked by size).
    verify_shards: bool = False
    # With model=none: stop where a GPU run hands a batch to the device (uint8 images and crop
    # offsets for the loaders the device finishes), so a CPU-only machine measures a GPU run's
    # host side. No copy to the device, no finishing.
    host_only: bool = False
    # Record the run in MLflow; false runs with no tracking at all.
    tracking: bool = True
    # Refuse n_workers whose estimated memory exceeds what is available; false starts them anyway.
    resource_check: bool = True
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4


@dataclass
class PrepareConfig(CommonConfig):
    # Shard format to write: pickle (the article's: pickled PIL images), raw (resized uint8
    # records), tar (WebDataset tars of the original files), litdata (LitData chunks of resized
    # uint8 samples; needs pip install -e '.[litdata]'). The formats are in shards/formats.py.
    format: str = "pickle"
    # Processes decoding and writing shards.
    n_workers: int = 2


@dataclass
class AdviseConfig(TrainConfig):
    """python -m facebench.advise: train.py's keys, and how much to measure."""

    # Seconds for the whole answer: the compute ceiling, then every loader.
    budget_s: float = 300.0
    # Larger data sets are measured on a sample of this many images, linked into the cache.
    sample_images: int = 20_000
    # Loaders to measure (empty: every installed one), e.g. loaders=[dataset,raw].
    loaders: list[str] = dataclasses.field(default_factory=list)
    # Worker counts to try (empty: 1, 2, 4, ... up to the cores), e.g. workers=[1,2].
    workers: list[int] = dataclasses.field(default_factory=list)


_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def register_configs() -> None:
    """Put the schemas where the YAML files' defaults lists can find them."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="prepare_schema", node=PrepareConfig)
    cs.store(name="advise_schema", node=AdviseConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="loader", name="loader_schema", node=LoaderConfig)


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
    problems += _choice_problems(cfg)
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))


def _choice_problems(cfg: DictConfig) -> list[str]:
    """Names that must be among the registered ones (shard formats, loaders) and advise's own
    amounts."""
    from facebench import loaders  # the registries import the schemas above
    from facebench.shards import formats

    problems = []
    shard_format = OmegaConf.select(cfg, "format")
    if shard_format is not None and shard_format not in formats.names():
        problems.append(f"format={shard_format}: use one of {', '.join(formats.names())}")
    for name in OmegaConf.select(cfg, "loaders") or []:
        if name not in loaders.names(real_only=True):
            choices = ", ".join(loaders.names(real_only=True))
            problems.append(f"loaders: {name} is no loader; choose from {choices}")
    for key in ("budget_s", "sample_images"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value <= 0:
            problems.append(f"{key}={value}: must be above 0")
    if any(count < 1 for count in OmegaConf.select(cfg, "workers") or []):
        problems.append(f"workers={list(cfg.workers)}: every worker count must be 1 or more")
    return problems


_AT_LEAST_ONE = (
    "batch_size",
    "epochs",
    "repeat",
    "shard_size",
    "loader.prefetch_factor",
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
    sample_hz = OmegaConf.select(cfg, "sample_hz")
    if sample_hz is not None and not 0 <= sample_hz <= 100:
        problems.append(f"sample_hz={sample_hz}: use 0 (off) to 100")
    return problems


def _mode_problems(cfg: DictConfig) -> list[str]:
    """Choices that contradict each other."""
    problems = []
    if OmegaConf.select(cfg, "loader.name") == "synthetic" and cfg.model == "none":
        problems.append(
            "loader=synthetic with model=none measures nothing: it hands the same batch, already "
            "on the device, to no model. It is the compute ceiling: use it with a model"
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
