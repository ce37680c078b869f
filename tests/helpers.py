"""Test helpers: what a loader should deliver, computed the slow, obvious way."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import psutil
import pytest
import torch

from facebench import loaders
from facebench.config import Workers
from facebench.data.images import open_sample
from facebench.data.listing import list_usable
from facebench.data.location import data_layout
from facebench.data.sources import FACES, Layout, read_records
from facebench.data.transforms import ARTICLE, Geometry, article_transform
from facebench.host.distributed import World
from facebench.host.paths import cache_dir
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import Handover, LoaderSpec, Pixels
from facebench.run.finish import Finisher
from facebench.shards.manifest import Manifest

Samples = dict[int, tuple[torch.Tensor, int]]
# Every loader that reads real samples (all but the compute ceiling), and its traits with its
# default options: lists derived from the registry, never written out.
LOADERS = loaders.names(real_only=True)
TRAITS = {name: loaders.get(name).traits_for() for name in LOADERS}
# Loaders with no worker process to lose (threads of the loop's process, or none).
THREADED = [name for name in LOADERS if TRAITS[name].workers != Workers.process]
# torchvision.io or DALI decoding and resampling: the same pixels within a few grey levels.
CLOSE = [name for name in LOADERS if TRAITS[name].pixels == Pixels.close]
UINT8 = [name for name in LOADERS if TRAITS[name].handover == Handover.uint8]
TOLERANCE = 4 / 255 / 0.225  # four grey levels, in normalized units
# The loaders a per-loader test runs for in the fast subset (pytest -m "not slow"): one of each
# kind, worker processes over image files (the article's), threads over pre-decoded shards, and
# a streaming pipeline over tar shards. The full suite runs every loader.
FAST_LOADERS = ["dataset", "raw", "webdataset"]


def in_two_sweeps(names: list[str] = LOADERS) -> pytest.MarkDecorator:
    """A test over `names` in one train.py sweep, parametrized as two: loader=raydata's apart,
    in the Ray group (tests/conftest.py), the others' beside that group rather than in it."""
    others = [name for name in names if name != "raydata"]
    cases = [pytest.param(others, id="others")]
    if "raydata" in names:
        cases.append(pytest.param(["raydata"], id="raydata"))
    return pytest.mark.parametrize("loaders", cases)


def context(cfg, root: Path, device: str = "cpu", world: World | None = None) -> LoaderContext:
    """The context the run would give cfg's loader over the data at root (listed and checked
    once, as the runner does)."""
    listing = list_usable(
        root, cfg.on_bad_sample, cache_dir(cfg.data.cache_dir), 1, data_layout(cfg.data)
    )
    spec = loaders.get(cfg.loader.name)
    return loaders.context(cfg, spec, listing, torch.device(device), world)


def prepared(cfg, root: Path, device: str = "cpu") -> tuple[LoaderSpec, LoaderContext]:
    """cfg's loader and its context, with the job's preparation done (shards built)."""
    ctx = context(cfg, root, device)
    spec = loaders.get(cfg.loader.name)
    spec.set_up_job(ctx)
    return spec, ctx


def delivered(
    batches: Iterable[Batch], device: str = "cpu", geometry: Geometry = ARTICLE
) -> Samples:
    """{sample id: (image, label)} over one epoch, each batch finished on `device` as the epoch
    loop finishes it; fails on a repeated sample."""
    seen: Samples = {}
    finish = Finisher(torch.device(device), geometry)
    for batch in batches:
        assert isinstance(batch, Batch), type(batch)
        images, labels = finish(batch)
        ids = batch.ids
        assert len(images) == len(labels) == len(ids)
        for image, label, sample_id in zip(images, labels, ids.tolist(), strict=True):
            assert sample_id not in seen, f"sample {sample_id} delivered twice"
            # A copy: the finisher reuses its buffers.
            seen[sample_id] = (image.to("cpu", torch.float32, copy=True), int(label))
    return seen


def expected(root: Path, layout: Layout = FACES, geometry: Geometry = ARTICLE) -> Samples:
    """Every sample of the tree, decoded and center-cropped directly, by canonical id."""
    transform = article_transform("center", geometry)
    records, _ = read_records(root, layout)
    return {i: (transform(open_sample(r.path, r.source)), r.label) for i, r in enumerate(records)}


def assert_same_samples(seen: Samples, truth: Samples, atol: float = 1e-5) -> None:
    """Same ids, same labels, same pixels (to atol, in normalized units)."""
    assert set(seen) <= set(truth), "ids that are not in the data"
    for sample_id, (image, label) in seen.items():
        want_image, want_label = truth[sample_id]
        assert label == want_label, f"sample {sample_id}: label {label}, expected {want_label}"
        assert image.shape == want_image.shape
        error = (image - want_image).abs().max().item()
        assert error <= atol, f"sample {sample_id}: pixels differ by up to {error}"


def workers_up(process: subprocess.Popen, n_workers: int, deadline: float) -> list[psutil.Process]:
    """Once `process` has forked `n_workers` processes (its epoch is under way) and they have
    had half a second at their first batches: every process below it."""
    main = psutil.Process(process.pid)
    while len(main.children(recursive=True)) < n_workers:
        assert process.poll() is None, "the run ended before its workers started"
        assert time.monotonic() < deadline, "the run's workers never started"
        time.sleep(0.05)
    time.sleep(0.5)
    return main.children(recursive=True)


# Holds a shard folder's build lock as another builder's process would, until its stdin closes.
HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("locked", flush=True)
sys.stdin.read()
os.ftruncate(fd, 0)  # a build that finished says so
"""


def replace_shard(folder: Path, name: str, data: bytes) -> None:
    """Write a shard and make the manifest agree with it, as anyone with write access can."""
    (folder / name).write_bytes(data)
    manifest = Manifest.read(folder)
    manifest.shards = [
        dataclasses.replace(shard, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        if shard.name == name
        else shard
        for shard in manifest.shards
    ]
    manifest.write(folder)
