"""Every loader yields each sample exactly once per epoch, with the shared preprocessing."""

from __future__ import annotations

import pytest
import torch

from facebench import loaders
from facebench.data.roots import shards_root
from facebench.data.sources import label_space
from facebench.data.transforms import seed_transform
from facebench.loaders.base import LoaderContext
from tests.helpers import delivered, expected

SEED_LOADERS = ["dataset"]


def context(cfg, root, n_workers: int, batch_size: int) -> LoaderContext:
    return LoaderContext(
        options=cfg.loader,
        data_root=root,
        labels=label_space(root),
        batch_size=batch_size,
        n_workers=n_workers,
        seed=0,
        device=torch.device("cpu"),
        transform=seed_transform("center"),
        shards_dir=shards_root(cfg.shards_dir, root, cfg.loader.name),
        shard_size=cfg.shard_size,
    )


@pytest.fixture(scope="module")
def truth(synthetic_root):
    return expected(synthetic_root)


def _epoch(make_cfg, synthetic_root, name, n_workers, batch_size):
    cfg = make_cfg(f"loader={name}", "loader.crop=center", "shard_size=32")
    module = loaders.get(name)
    ctx = context(cfg, synthetic_root, n_workers, batch_size)
    if hasattr(module, "before_epoch"):
        module.before_epoch(ctx)
    return delivered(module.build(ctx))


@pytest.mark.parametrize("name", SEED_LOADERS)
@pytest.mark.parametrize("n_workers", [0, 2])
def test_every_sample_exactly_once(make_cfg, synthetic_root, truth, name, n_workers):
    # 120 images, batches of 8: drop_last drops nothing, so the epoch is the whole set.
    assert _epoch(make_cfg, synthetic_root, name, n_workers, batch_size=8) == truth


@pytest.mark.parametrize("name", SEED_LOADERS)
def test_drop_last_drops_only_the_remainder(make_cfg, synthetic_root, truth, name):
    seen = _epoch(make_cfg, synthetic_root, name, n_workers=2, batch_size=50)
    assert sum(seen.values()) == 100  # two full batches of 50; the last 20 are dropped
    assert max(seen.values()) == 1
    assert not seen - truth  # nothing that is not in the data


def test_unknown_loader_lists_the_choices():
    with pytest.raises(Exception, match="no such loader; choose one of .*dataset"):
        loaders.get("nope")
