"""Every loader yields each sample exactly once per epoch, with the shared preprocessing."""

from __future__ import annotations

import pytest
import torch

from facebench import loaders
from facebench.data.roots import shards_root
from facebench.data.sources import read_records
from facebench.data.transforms import seed_transform
from facebench.loaders.base import LoaderContext
from tests.helpers import delivered, expected

SEED_LOADERS = ["dataset", "datapipe", "pickle"]


def context(cfg, root, n_workers: int, batch_size: int) -> LoaderContext:
    records, labels = read_records(root)
    return LoaderContext(
        options=cfg.loader,
        data_root=root,
        labels=labels,
        records=records,
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
    # 120 images in batches of 4. Iterable pipelines batch inside each worker, so drop_last
    # drops a remainder per worker; with 4 | 60 (datapipe) and 4 | every shard (32 or 24 samples,
    # pickle) nothing is dropped and the epoch must be exactly the whole set.
    assert _epoch(make_cfg, synthetic_root, name, n_workers, batch_size=4) == truth


@pytest.mark.parametrize("name", SEED_LOADERS)
def test_drop_last_drops_only_a_remainder(make_cfg, synthetic_root, truth, name):
    n_workers, batch_size = 2, 50
    seen = _epoch(make_cfg, synthetic_root, name, n_workers, batch_size)
    assert max(seen.values()) == 1  # no repeats
    assert not seen - truth  # nothing that is not in the data
    total = sum(seen.values())
    assert total % batch_size == 0
    # A map-style loader drops one remainder; an iterable one up to one per worker.
    assert total >= 120 - n_workers * (batch_size - 1)


def test_unknown_loader_lists_the_choices():
    with pytest.raises(Exception, match="no such loader; choose one of .*dataset"):
        loaders.get("nope")
