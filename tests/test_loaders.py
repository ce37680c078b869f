"""Every loader yields each sample exactly once per epoch, with the shared preprocessing."""

from __future__ import annotations

import pytest
import torch

from facebench import loaders
from facebench.config import LoaderConfig
from facebench.errors import ConfigError
from facebench.loaders.spec import LoaderSpec, Traits
from facebench.run.runner import run_training
from tests.helpers import (
    CLOSE,
    LOADERS,
    TOLERANCE,
    UINT8,
    assert_same_samples,
    delivered,
    expected,
    prepared,
)


@pytest.fixture(scope="module")
def truth(synthetic_root):
    return expected(synthetic_root)


def _epoch(make_cfg, synthetic_root, name, n_workers, batch_size):
    cfg = make_cfg(
        f"loader={name}",
        "loader.crop=center",
        "shard_size=32",
        f"n_workers={n_workers}",
        f"batch_size={batch_size}",
    )
    module, ctx = prepared(cfg, synthetic_root)
    return delivered(module.build(ctx))


@pytest.mark.every_loader  # the contract itself: in the fast subset for every loader
@pytest.mark.parametrize("name", LOADERS)
@pytest.mark.parametrize("n_workers", [0, 2])
def test_every_sample_exactly_once(make_cfg, synthetic_root, truth, name, n_workers):
    # 120 images in batches of 4. Iterable pipelines batch inside each worker, so drop_last
    # drops a remainder per worker; with 4 | 60 (datapipe) and 4 | every shard (32 or 24 samples,
    # pickle) nothing is dropped and the epoch must be exactly the whole set.
    seen = _epoch(make_cfg, synthetic_root, name, n_workers, batch_size=4)
    assert len(seen) == len(truth)
    assert_same_samples(seen, truth, atol=TOLERANCE if name in CLOSE else 1e-5)


@pytest.mark.parametrize("name", LOADERS)
def test_drop_last_drops_only_a_remainder(make_cfg, synthetic_root, truth, name):
    n_workers, batch_size = 2, 50
    seen = _epoch(make_cfg, synthetic_root, name, n_workers, batch_size)  # fails on repeats
    assert_same_samples(seen, truth, atol=TOLERANCE if name in CLOSE else 1e-5)
    total = len(seen)
    assert total % batch_size == 0
    # A map-style loader drops one remainder; an iterable one up to one per worker.
    assert total >= 120 - n_workers * (batch_size - 1)


def test_unknown_loader_lists_the_choices():
    with pytest.raises(Exception, match="no such loader; choose one of .*dataset"):
        loaders.get("nope")


def test_every_configured_loader_declares_its_contract():
    # conf/loader/<name>.yaml names a module that defines LOADER = LoaderSpec(...).
    assert "dataset" in loaders.names() and "shared" not in loaders.names()
    for name in loaders.names():
        spec = loaders.get(name)
        assert isinstance(spec, LoaderSpec), name
        assert issubclass(spec.options, LoaderConfig), name
        assert isinstance(spec.traits_for(), Traits), name


def test_a_module_without_a_contract_is_refused(tmp_path, monkeypatch):
    (tmp_path / "shared.yaml").write_text("name: shared\n")  # a helper module, not a loader
    monkeypatch.setattr(loaders, "CONFIGS", tmp_path)
    with pytest.raises(ConfigError, match="defines no LOADER = LoaderSpec"):
        loaders.get("shared")


@pytest.mark.parametrize("name", LOADERS)
def test_host_only_delivers_every_sample_once_as_a_gpu_run_receives_it(make_cfg, name):
    metrics = run_training(
        make_cfg(f"loader={name}", "host_only=true", "n_workers=2", "batch_size=4", "shard_size=32")
    )
    # run_training checked the epoch: every sample once (less drop_last's remainders).
    assert metrics["samples_unique"] == metrics["samples_seen"] >= 120 - 2 * 3


@pytest.mark.parametrize("name", LOADERS)
def test_the_device_finishes_the_loaders_that_hand_over_uint8(make_cfg, synthetic_root, name):
    cfg = make_cfg(f"loader={name}", "shard_size=32", "batch_size=4")
    module, ctx = prepared(cfg, synthetic_root)
    batch = next(iter(module.build(ctx)))
    if name in UINT8:
        assert batch.images.dtype == torch.uint8 and batch.images.shape[1:] == (112, 112, 3)
        assert batch.offsets is not None and batch.offsets.shape == (4, 2)
    else:
        assert batch.images.dtype == torch.float32 and batch.offsets is None
