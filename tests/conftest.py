"""Shared fixtures: real-layout trees on disk, and configs composed the way train.py does."""

from __future__ import annotations

import io
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from PIL import Image

from facebench.config import typed
from facebench.data.synthetic import ensure_synthetic
from facebench.entry import configure
from facebench.paths import PROJECT_ROOT
from tests.helpers import FAST_LOADERS, LOADERS

CONF_DIR = str(PROJECT_ROOT / "conf")

configure()


def _image_bytes(mode: str, size: tuple[int, int], seed: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    channels = len(mode)
    pixels = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, format=fmt)
    return buffer.getvalue()


def write_tree(
    root: Path,
    celeba: dict[str, int],
    digiface: dict[int, int],
    label_text: str | None = None,
) -> Path:
    """A real-layout tree: CelebA images named in `celeba` (name -> identity) and
    `digiface[folder]` PNGs per folder. `label_text` replaces the generated label file."""
    images = root / "CelebA" / "img_align_celeba"
    images.mkdir(parents=True)
    for index, name in enumerate(celeba):
        (images / name).write_bytes(_image_bytes("RGB", (178, 218), index, "JPEG"))
    if label_text is None:
        label_text = "".join(f"{name} {identity}\n" for name, identity in celeba.items())
    (root / "CelebA" / "identity_CelebA.txt").write_bytes(label_text.encode())
    for folder, count in digiface.items():
        path = root / "DigiFace1M" / str(folder)
        path.mkdir(parents=True)
        for number in range(count):
            data = _image_bytes("RGBA", (112, 112), 1000 * (folder + 1) + number, "PNG")
            (path / f"{number}.png").write_bytes(data)
    (root / "DigiFace1M").mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture
def tree_factory(tmp_path: Path) -> Callable[..., Path]:
    counter = iter(range(1000))

    def make(**kwargs) -> Path:
        return write_tree(tmp_path / f"tree{next(counter)}", **kwargs)

    return make


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder shared by the whole session, so synthetic trees are generated once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def synthetic_root(cache: Path) -> Path:
    return ensure_synthetic(cache, n_images=120, seed=0, n_procs=1)


def compose_config(*overrides: str, config_name: str = "train") -> DictConfig:
    """train.yaml (or prepare.yaml, advise.yaml) composed as the entry point would."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


@pytest.fixture
def make_cfg(cache: Path) -> Callable[..., Any]:
    """The typed config a job receives (composed and checked as train.py does), overridden to
    the cheapest settings: what run_training, run_prepare and the loaders take."""

    def make(*overrides: str, config_name: str = "train") -> Any:
        cheap = [f"data.cache_dir={cache}", "data.n_images=120"]
        if config_name != "prepare":
            cheap += ["device=cpu", "tracking=false", "n_workers=0", "batch_size=8", "model=none"]
        return typed(compose_config(*cheap, *overrides, config_name=config_name))

    return make


@pytest.fixture
def prepare_here(make_cfg, caplog) -> Callable[..., str]:
    """prepare.py's job with these overrides, run in this process; what it logged. For the
    builds a test needs finished, not killed (only those need processes of their own)."""
    from facebench.shards.prepare import run_prepare

    def run(*overrides: str) -> str:
        with caplog.at_level(logging.INFO):
            run_prepare(make_cfg(*overrides, config_name="prepare"))
        return caplog.text

    return run


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its tables made and nothing in it. Making the tables takes
    MLflow a second or two; tests copy this file instead of each paying for it."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "empty.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def isolated_env(tmp_path: Path, empty_store: Path) -> dict[str, str]:
    """Environment for train.py subprocesses: a private MLflow store, no terminal tricks."""
    env = dict(os.environ)
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def ray_here() -> Any:
    """One local Ray instance for this process's loader=raydata cases (2 CPUs, a 512 MB object
    store): each job then uses this connection and leaves it open, rather than starting and
    stopping an instance of its own (7 s each). Starting and stopping is tested in
    subprocesses (tests/test_raydata.py)."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        object_store_memory=512 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _raydata_cases_share_ray(request: pytest.FixtureRequest) -> None:
    if _loader_of(request.node) == "raydata":
        request.getfixturevalue("ray_here")


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped, not deleted, where there is no CUDA device. A test run once per
    loader runs in the fast subset for the loaders of FAST_LOADERS only (every loader if it is
    marked every_loader); the full suite runs it for all. A loader=raydata case runs after all
    others: its first one connects this process to Ray (Ray Data starts a local instance), and
    no other loader's workers should then be forked from a process with Ray's threads."""
    import torch

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if skip is not None and "gpu" in item.keywords:
            item.add_marker(skip)
        loader = _loader_of(item)
        if loader in LOADERS and loader not in FAST_LOADERS and "every_loader" not in item.keywords:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: _loader_of(item) == "raydata")  # stable: otherwise in order


def _loader_of(item) -> str | None:
    params = getattr(item, "callspec", None)
    return params and (params.params.get("loader") or params.params.get("name"))
