"""The user's pipeline, built from its `_target_` before any clock: found, called, and sorted
into what facebench does with it; every way that can go wrong is one line naming the target."""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset

from facebench.errors import ConfigError

KEY = "loader.dataset"
_FORM = "loader=custom loader.dataset._target_=mymodule.MyDataset"


class Kind(StrEnum):
    map = "map-style Dataset"  # facebench wraps it in its DataLoader
    iterable = "IterableDataset"  # facebench wraps it in its DataLoader
    loader = "DataLoader"  # used as it is
    batches = "iterable of batches"  # used as it is


@dataclass(frozen=True)
class Built:
    """What the target gave, and what facebench knows of it."""

    target: str  # the dotted name, for lines and tags
    pipeline: Any
    kind: Kind
    build_s: float  # building it, outside the clock

    @property
    def dataset(self) -> Any:
        """The samples' dataset: the pipeline, or the dataset of a DataLoader."""
        return self.pipeline.dataset if self.kind == Kind.loader else self.pipeline

    def length(self) -> int | None:
        """The samples an epoch holds, where the dataset says (`__len__`)."""
        try:
            return len(self.dataset)
        except TypeError:  # no __len__, or an IterableDataset's that raises
            return None

    def classes(self) -> tuple[str, ...]:
        """Its class names, where it has them (ImageFolder's `classes`)."""
        classes = getattr(self.dataset, "classes", None)
        return tuple(str(name) for name in classes) if isinstance(classes, list | tuple) else ()


def build(spec: Any, key: str = KEY) -> Built:
    """Call `spec`'s `_target_` (with its other keys as arguments) and sort what it returns."""
    node = _as_dict(spec, key)
    target = node.get("_target_")
    if not target or target == "???":
        raise ConfigError(
            f"{key}._target_ is not set: name your Dataset class, or a function that returns a "
            f"Dataset, IterableDataset or DataLoader: {_FORM}"
        )
    found = find(str(target), f"{key}._target_")
    if not callable(found):
        raise ConfigError(
            f"{key}._target_={target} is a {type(found).__name__}, not a class or function: "
            "name the class or function that builds your data"
        )
    started = time.perf_counter()
    pipeline = _instantiate(node, key)
    return Built(str(target), pipeline, _kind(pipeline, str(target)), time.perf_counter() - started)


def collate_fn(spec: Any, key: str = "loader.collate_fn") -> Callable[[Any], Any] | None:
    """The user's collate function from its block: a function named alone, as it is; with other
    keys, a partial of it; a class, its instance (built with the keys). None: torch's."""
    node = _as_dict(spec, key) if spec is not None else {}
    target = node.get("_target_")
    if not target:
        return None
    found = find(str(target), f"{key}._target_")
    if isinstance(found, type):  # a collator class: its instance collates
        collate = _instantiate(node, key)
    elif len(node) == 1:
        collate = found
    else:
        collate = _instantiate({**node, "_partial_": True}, key)
    if not callable(collate):
        raise ConfigError(f"{key}._target_={target} gave a {type(collate).__name__}, not callable")
    return collate


def _instantiate(node: dict[str, Any], key: str) -> Any:
    """Hydra's instantiate; an error the user's code raised, in one line naming the key."""
    target = node.get("_target_")
    try:
        return instantiate(node, _convert_="all")
    except Exception as error:  # noqa: BLE001 - the user's code: any error is theirs to read
        cause = error.__cause__ or error if isinstance(error, InstantiationException) else error
        raise ConfigError(
            f"{key}._target_={target} raised {type(cause).__name__} while being built: "
            f"{_first_line(cause)}{_shards_hint(cause)}"
        ) from error


def find(target: str, key: str) -> Any:
    """The object a dotted name names, looked up in the launch directory and on PYTHONPATH; a
    module that is missing or fails to import is one line saying which and what to do."""
    launch = os.getcwd()
    if launch not in sys.path:  # `python train.py` puts the script's folder first, not cwd's
        sys.path.append(launch)
    module_name, _, name = target.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"{key}={target}: give the module too, as module.{target} (the module's file in the "
            "launch directory or on PYTHONPATH)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and not module_name.startswith(error.name) and error.name != module_name:
            raise ConfigError(
                f"{key}={target}: importing {module_name} needs {error.name}, which is not "
                f"installed here: {_first_line(error)}"
            ) from error
        path = os.environ.get("PYTHONPATH", "")
        raise ConfigError(
            f"{key}={target}: no module {module_name} in the launch directory ({launch}) or on "
            f"PYTHONPATH ({path or 'not set'}); run from its folder, or set "
            f"PYTHONPATH=/folder/holding/{module_name.split('.')[0]}"
        ) from error
    except Exception as error:  # noqa: BLE001 - the user's module: any error is theirs
        raise ConfigError(
            f"{key}={target}: importing {module_name} raised {type(error).__name__}: "
            f"{_first_line(error)}"
        ) from error
    if not hasattr(module, name):
        public = sorted(entry for entry in vars(module) if not entry.startswith("_"))
        raise ConfigError(
            f"{key}={target}: module {module_name} ({module.__file__}) has no {name}; "
            f"it has {', '.join(public[:12]) or 'nothing public'}"
        )
    return getattr(module, name)


def _kind(pipeline: Any, target: str) -> Kind:
    if isinstance(pipeline, DataLoader):
        return Kind.loader
    if isinstance(pipeline, IterableDataset):
        return Kind.iterable
    if isinstance(pipeline, Dataset) or (
        hasattr(pipeline, "__getitem__") and hasattr(pipeline, "__len__")
    ):
        return Kind.map  # a Hugging Face datasets.Dataset too
    if hasattr(pipeline, "__iter__"):
        return Kind.batches
    raise ConfigError(
        f"{KEY}._target_={target} returned a {type(pipeline).__name__}, which is not a Dataset, "
        "IterableDataset, DataLoader or iterable of batches: return one of those"
    )


def _as_dict(spec: Any, key: str) -> dict[str, Any]:
    if isinstance(spec, DictConfig):
        return OmegaConf.to_container(spec, resolve=True)  # type: ignore[return-value]
    if isinstance(spec, dict):
        return dict(spec)
    raise ConfigError(f"{key} must be a block with a _target_: {_FORM}")


def _shards_hint(error: BaseException) -> str:
    """facebench's own shards of a folder data set live in <folder>/facebench-shards unless
    shards_dir says otherwise: an ImageFolder over that folder takes them for a class."""
    if "facebench-shards" not in str(error):
        return ""
    return (
        " (facebench-shards/ holds facebench's shards of that folder, built by a loader that "
        "read it with data=folder: delete it, and give those runs shards_dir=/elsewhere)"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
