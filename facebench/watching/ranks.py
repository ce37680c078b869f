"""Several ranks watched (DDP under torchrun): each measures its own loop; rank 0 records the
job, each epoch's metrics pooled over the ranks as train.py pools them (host/distributed.py's
whole_job).

The ranks' metrics meet in torch.distributed's own key-value store, not in a collective: a rank
whose loop raised, or that watches a loader the others do not, must leave no rank waiting. Rank
0 waits a while for the others' and, where some never come, records what it has and says so.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from facebench.host.distributed import whole_job

log = logging.getLogger("facebench.watch")

WAIT_FOR_RANKS_S = 60.0
_PREFIX = "facebench/watch"


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the job's world size; (0, 1) outside torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def pooled(
    epochs: list[dict[str, float]], key: str, wait_s: float = WAIT_FOR_RANKS_S
) -> list[dict[str, float]] | None:
    """On rank 0, `epochs` pooled with every other rank's under `key` (the n-th watch of this
    process: every rank counts its watches alike); on the other ranks, theirs handed to rank 0,
    and None (they record nothing)."""
    rank, size = rank_and_size()
    if size == 1:
        return epochs
    store = _store()
    if store is None:
        log.warning("watch: ranks' metrics cannot meet (no store): rank %d records its own", rank)
        return epochs if rank == 0 else None
    if rank != 0:
        store.set(f"{_PREFIX}/{key}/{rank}", json.dumps(epochs))
        return None
    per_rank = [epochs]
    deadline = time.monotonic() + wait_s  # one wait for them all, however many are missing
    for other in range(1, size):
        left = max(0.1, deadline - time.monotonic())
        try:
            store.wait([f"{_PREFIX}/{key}/{other}"], timedelta(seconds=left))
            per_rank.append(json.loads(store.get(f"{_PREFIX}/{key}/{other}")))
        except Exception:  # torch raises a plain RuntimeError (or DistStoreError) on timeout
            log.warning(
                "watch: rank %d sent no metrics within %.0f s (its loop may have raised): "
                "the job is recorded from the ranks that did",
                other,
                wait_s,
            )
    return _merged(per_rank)


def _merged(per_rank: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Each epoch's metrics over the ranks that measured it."""
    per_rank = [epochs for epochs in per_rank if epochs]  # a rank that measured nothing
    if not per_rank:
        return []
    n_epochs = min(len(epochs) for epochs in per_rank)
    merged = []
    for step in range(n_epochs):
        metrics = whole_job([epochs[step] for epochs in per_rank])
        metrics["world_size"] = float(len(per_rank))
        merged.append(metrics)
    return merged


def _store() -> Any:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # a torch without it, a group made without a store
        return None
