"""Every config key with fixed choices, once, as an Enum: Hydra refuses any other value as it
composes (`amp=fp8`, `cache=hot`), and `choice` does the same for callers that bypass it."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from facebench.errors import ConfigError


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
    fast = "fast"  # libspng and libjpeg-turbo called directly, PIL's pixels; uint8 as torchvision


class ParquetMode(StrEnum):
    """How loader=parquet reads its files through Hugging Face datasets."""

    map = "map"  # a map-style Dataset (its Arrow copy), read at random by a shuffled DataLoader
    streaming = "streaming"  # an IterableDataset: the files in turn, through a shuffle buffer


class Sync(StrEnum):
    """When an emulated accelerator's step is waited for (facebench/run/accelerator.py)."""

    every_step = "every_step"  # the loop waits for each step (the article's reads the loss)
    none = "none"  # the loop goes on while the step computes, a launch queue ahead


class Answers(StrEnum):
    """Who answers a request from a bucket at an emulated distance (storage.answers)."""

    copy = "copy"  # the relay, from its copy of each object: the server costs the host nothing
    endpoint = "endpoint"  # the endpoint, through the relay: to measure that server itself


class S3Client(StrEnum):
    """The S3 client library each image's GET goes through (storage.client): one module each in
    facebench/storage/clients/."""

    crt = "crt"  # AWS's CRT client, as s3torchconnector wraps it
    boto3 = "boto3"  # the AWS SDK for Python
    obstore = "obstore"  # Rust's object_store
    s3dlio = "s3dlio"  # Rust, made for AI/ML loading (CPython 3.11 wheels only)
    fsspec = "fsspec"  # s3fs, fsspec's S3 file system


class Workers(StrEnum):
    """Where a loader's work runs (its traits), and loader.method's choice for those that
    offer one (nodes: process or thread)."""

    process = "process"  # worker processes (batches cross between processes)
    thread = "thread"  # threads of the loop's own process
    none = "none"  # everything in the loop itself


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
