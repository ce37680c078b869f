"""Every epoch is checked: each sample at most once, and as many as the loader must deliver."""

from __future__ import annotations

from facebench.config import TrainConfig
from facebench.errors import FacebenchError
from facebench.loaders.spec import LoaderSpec


def check_exactly_once(
    cfg: TrainConfig, loader: LoaderSpec, n_samples: int, metrics: dict[str, float]
) -> None:
    """Fail loudly when an epoch repeated samples or delivered a different count than it must.

    Loaders that batch in one place drop one remainder: exactly n - n % batch_size samples.
    Loaders whose workers each batch their own shards drop up to one remainder per worker.
    """
    seen = int(metrics["samples_seen"])
    unique = int(metrics.get("samples_unique", seen))
    batch = cfg.batch_size
    if unique != seen:
        raise FacebenchError(
            f"loader={cfg.loader.name} delivered {seen - unique} samples more than once in one "
            "epoch; its results would misreport the pipeline. This is a bug in the loader"
        )
    world_size = int(metrics.get("world_size", 1))
    if loader.batches_per_worker_for(cfg.loader):
        workers = max(cfg.n_workers, 1) * world_size
        low, high = max(0, n_samples - workers * (batch - 1)), n_samples
        ok = low <= seen <= high and seen % batch == 0
        expected = f"between {low} and {high}, in whole batches"
    else:
        # Every rank gets the same whole number of batches.
        whole = n_samples - n_samples % (batch * world_size)
        ok = seen == whole
        expected = str(whole)
    if not ok:
        raise FacebenchError(
            f"loader={cfg.loader.name} delivered {seen} samples in an epoch, expected {expected} "
            f"of {n_samples} (batch_size={batch}, n_workers={cfg.n_workers}); the run is not a "
            "fair measurement. Check the shards (prepare.py) or report a bug"
        )
