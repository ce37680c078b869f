"""Shared fixtures: real-layout trees on disk, and configs composed the way train.py does."""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from PIL import Image

from facebench.config import typed
from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import PROJECT_ROOT
from facebench.host.ports import free_port
from facebench.host.printable import printable
from facebench.run.entry import configure
from facebench.storage import client, server
from tests.helpers import FAST_LOADERS, LOADERS

CONF_DIR = str(PROJECT_ROOT / "conf")

configure()
# Ray starts its workers at nice 15, which leaves them starved beside the suite's other test
# process (a raydata epoch then takes minutes): here they compete as every loader's workers do.
os.environ.setdefault("RAY_worker_niceness", "0")


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
    """A cache folder shared by the whole run, every pytest-xdist worker included, so that each
    synthetic tree and default shard set is built once. Their builders may race safely, as
    jobs of a sweep do: a tree takes its name by an atomic rename, a shard set is built under
    a lock (facebench/shards/lock.py). Tests that damage shards build their own elsewhere."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the folder every worker's base temp lies in
    path = base / "cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def synthetic_root(cache: Path) -> Path:
    return ensure_synthetic(cache, n_images=120, seed=0, n_procs=1)


@pytest.fixture
def data_copy(tmp_path, synthetic_root) -> Path:
    """A private copy of the synthetic tree, safe to change."""
    root = tmp_path / "data"
    shutil.copytree(synthetic_root, root, ignore=shutil.ignore_patterns("facebench-shards"))
    return root


@pytest.fixture(scope="session")
def default_size_root(cache: Path) -> Path:
    """train.py's default set, 6,000 images, for the tests that need epochs that long. Session
    scoped, so that it is made before a test marked `alone` takes the machine: the fixtures of
    a wider scope are set up first, the turn (`_alone_when_asked`) with the test's own."""
    return ensure_synthetic(cache, n_images=6000, seed=0)


def compose_config(*overrides: str, config_name: str = "train") -> DictConfig:
    """train.yaml (or prepare.yaml, advise.yaml) composed as the entry point would."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


@pytest.fixture
def make_cfg(cache: Path) -> Callable[..., Any]:
    """The typed config a job receives (composed and checked as train.py does), overridden to
    the cheapest settings: what run_training, run_prepare and the loaders take. The data are the
    suite's shared set unless `cache_dir` names a folder of the test's own."""

    def make(*overrides: str, config_name: str = "train", cache_dir: Path = cache) -> Any:
        cheap = [f"data.cache_dir={cache_dir}", "data.n_images=120"]
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


def _ray_here() -> None:
    """One local Ray instance for this process's loader=raydata cases (2 CPUs, a 512 MB object
    store): each job then uses this connection and leaves it open, rather than starting and
    stopping an instance of its own (7 s each). Starting and stopping is tested in
    subprocesses (tests/test_raydata.py)."""
    import ray

    if ray.is_initialized():
        return
    ray.init(
        address="local",
        num_cpus=2,
        object_store_memory=512 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )


def _end_ray_here() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from facebench.loaders.ray_threads import end_threads

        end_threads()
        ray.shutdown()


@pytest.fixture
def ray_with_this_environment() -> None:
    """This process's Ray started again, so that its tasks get the environment as it is now
    (credentials a test module set after an earlier module started Ray)."""
    _end_ray_here()
    _ray_here()


@pytest.fixture(autouse=True)
def _ray_only_for_its_cases(request: pytest.FixtureRequest) -> Iterator[None]:
    """A loader=raydata case shares this process's Ray instance; any other test runs with no
    Ray in the process, so that no loader's workers are forked from a process running Ray's
    threads (the Ray group runs first on its pytest-xdist worker, which then goes on to
    others)."""
    # pytest-xdist marks a grouped test's id with its group. Without the group, the raydata
    # cases would be spread over the workers, each starting and stopping a Ray of its own
    # between other tests, and the `alone` tests would wait on each other's locks.
    node = request.node
    loadgroup = getattr(request.config.option, "loadgroup", False)  # set in xdist's workers
    group = _group_of(node) if loadgroup else None
    if group and not node.nodeid.endswith(f"@{group}"):
        pytest.fail(
            f"pytest-xdist did not put this test in the {group} group (pytest-xdist#1386, "
            "under pytest 9.2): install the test tools pyproject.toml pins (pip install -e "
            "'.[dev]'), or run one test at a time (-n 0)"
        )
    if _loader_of(request.node) == "raydata":
        _ray_here()
    else:
        _end_ray_here()
    yield


@pytest.fixture(scope="session", autouse=True)
def _no_ray_left() -> Iterator[None]:
    yield
    _end_ray_here()


@pytest.fixture(scope="session")
def _turns(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """Under pytest-xdist, the folder all its workers share (each has a base temp of its own
    below it): the locks by which a test marked `alone` runs with no other beside it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return tmp_path_factory.getbasetemp().parent


@pytest.fixture(autouse=True)
def _alone_when_asked(request: pytest.FixtureRequest, _turns: Path | None) -> Iterator[None]:
    """A readers-writer lock across the suite's worker processes. Every test holds `tests`
    shared while it runs; one marked `alone` (it measures time or CPU, so another test beside
    it on these few cores would move its numbers) holds it exclusive. `gate` keeps a waiting
    `alone` test from being starved: while one waits, no other test starts.

    The `alone` tests form one pytest-xdist group, and the exclusive locks pass from one to
    the next in it: the other worker's test in progress is waited for once, not once a test
    (up to 40 s each).

    Why a lock and not pytest-xdist alone: its groups (`--dist loadgroup`, used here for Ray's
    tests and these) keep a group's tests in one worker, one after another, but nothing in
    pytest-xdist keeps the other workers idle meanwhile, and running these with `-n 0` would
    take a second pytest command beside the README's one. The lock is all that is added; which
    test runs where is still pytest-xdist's. (The pin of pytest in pyproject.toml is for the
    groups, not for this: under pytest 9.2.0 pytest-xdist 3.8 puts a group's tests on several
    workers, pytest-xdist#1386, checked with its reproducer; `_ray_only_for_its_cases` then
    fails each test in one line rather than letting them race.)"""
    if _turns is None:
        yield
        return
    if request.node.get_closest_marker("alone") is None:
        with (
            _locked(_turns / "gate", fcntl.LOCK_SH, hold=False),
            _locked(_turns / "tests", fcntl.LOCK_SH),
        ):
            yield
        return
    if _held_alone.stack is None:
        _held_alone.stack = contextlib.ExitStack()
        _held_alone.stack.enter_context(_locked(_turns / "gate", fcntl.LOCK_EX))
        _held_alone.stack.enter_context(_locked(_turns / "tests", fcntl.LOCK_EX))
    try:
        yield
    finally:
        following = getattr(request.node, "_next_item", None)
        if following is None or following.get_closest_marker("alone") is None:
            _held_alone.stack.close()
            _held_alone.stack = None


class _held_alone:  # noqa: N801 (a namespace)
    """This worker's exclusive locks, while a run of `alone` tests holds them."""

    stack: contextlib.ExitStack | None = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test knows the one after it in this process (pytest-xdist sends a group whole, so
    within one it is certain): `_alone_when_asked` keeps its locks across a run of them."""
    item._next_item = nextitem
    return (yield)


@contextlib.contextmanager
def _locked(path: Path, kind: int, hold: bool = True) -> Iterator[None]:
    """`path` flocked as `kind`; held until the block ends, or (hold=False) only passed
    through, as a turnstile."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, kind)
        if not hold:
            fcntl.flock(fd, fcntl.LOCK_UN)
        yield
    finally:
        os.close(fd)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output made printable, as facebench's own log handlers make it
    (facebench/host/printable.py): pytest's capture handler logs a file name's odd bytes as
    surrogates, which a report cannot carry from a pytest-xdist worker."""
    report = yield
    report.sections = [(title, printable(text)) for title, text in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        shown = printable(text)
        if shown is not text:  # a failure's message that names such a file
            report.longrepr = shown
    return report


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped, not deleted, where there is no CUDA device. A test run once per
    loader runs in the fast subset for the loaders of FAST_LOADERS only (every loader if it is
    marked every_loader); the full suite runs it for all. The loader=raydata cases, which share
    one Ray instance in their pytest-xdist worker (_ray_here), are one group, run one after
    another in one worker; a test that starts Ray in a process of its own may run beside them
    (those that count Ray's processes count their own job's: tests/ray_watch.py). The tests
    marked `alone` form a group too, so that they run back to back. Groups go first: each is a
    chain of tests one worker runs in turn. A test that starts Ray or the object server (the
    `s3` fixture) is slow: the fast subset starts neither."""
    import torch

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if skip is not None and "gpu" in item.keywords:
            item.add_marker(skip)
        loader = _loader_of(item)
        if loader in LOADERS and loader not in FAST_LOADERS and "every_loader" not in item.keywords:
            item.add_marker(pytest.mark.slow)
        if loader == "raydata":  # this worker's Ray instance, shared by the cases in turn
            item.add_marker(pytest.mark.xdist_group("ray"))
        if loader == "raydata" or _sweeps(item) == ["raydata"] or item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.slow)  # Ray's start alone takes seconds
        if "s3" in getattr(item, "fixturenames", ()):  # the object server's start, the same
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("alone") is not None:
            item.add_marker(pytest.mark.xdist_group("alone"))
    # The groups first (stable: otherwise in order): each runs its tests one after another in
    # one worker, so started late it would keep the suite waiting at its end.
    items.sort(key=lambda item: _group_of(item) is None)


def _group_of(item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return marker and (marker.args[0] if marker.args else marker.kwargs.get("name"))


def _sweeps(item) -> list[str] | None:
    """The loaders of a case of a test split by tests.helpers.in_two_sweeps."""
    params = getattr(item, "callspec", None)
    return params and params.params.get("loaders")


def _loader_of(item) -> str | None:
    params = getattr(item, "callspec", None)
    return params and (params.params.get("loader") or params.params.get("name"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[server.Running]:
    """A local object server for the module that asks for it, its credentials in the
    environment, and a bucket (the server and its client: pip install -e '.[s3server]')."""
    root = tmp_path_factory.mktemp("s3server")
    saved = {name: os.environ.get(name) for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    with server.local_server(root) as running:
        os.environ.update(running.environment())
        client.configure(client.Endpoint(running.endpoint, server.REGION, True))
        try:
            yield running
        finally:
            client.configure(None)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="module")
def moto(tmp_path_factory) -> Iterator[server.Running]:
    """moto's S3 server: an S3 implementation of its own, not Swift, to read the same way."""
    pytest.importorskip("moto", reason="moto's server: pip install -e '.[dev]'")
    import boto3
    import botocore.config
    import botocore.exceptions

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            boto3.client(
                "s3", endpoint_url=endpoint, region_name=server.REGION,
                aws_access_key_id=server.ACCESS_KEY, aws_secret_access_key=server.SECRET_KEY,
                config=botocore.config.Config(s3={"addressing_style": "path"}),
            ).create_bucket(Bucket=server.BUCKET)  # fmt: skip
            break
        except botocore.exceptions.EndpointConnectionError:
            assert time.monotonic() < deadline, "moto's server did not start"
            time.sleep(0.2)
    try:
        yield server.Running(endpoint, "", {}, False)
    finally:
        process.terminate()
        process.wait(timeout=10)
