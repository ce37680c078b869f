"""What a user's batch carries to the loop from the worker that assembled it: its producer's
stage times (taken as its collate ends), which worker made it, the first sample's digest (an
IterableDataset that every worker yields whole), the worker's private memory
(facebench/loaders/custom_batches.py unpacks it, facebench/custom/checks.py judges it)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch.utils.data import default_collate, get_worker_info

from facebench import stages
from facebench.errors import DataError

# A worker reads its private memory at most once a second, and so that the reads take at most
# this share of its time: reading /proc/self/smaps_rollup walks every mapping, 20 ms in a worker
# that has torch and CUDA's libraries mapped (measured here).
MEMORY_EVERY_S = 1.0
MEMORY_SHARE = 0.005


class Carried(NamedTuple):
    """A user's batch with what its producer measured."""

    batch: Any
    stages: stages.StageTimes | None
    worker: int  # -1: the loop's own process
    digest: str  # its first batch's first sample, else ""
    private_bytes: int  # the worker's private memory when it made it; -1 not read


class Carrier:
    """A collate function (the user's, or torch's default) whose time is the collate stage and
    whose batch travels with its producer's stage times and checks (`Carried`)."""

    def __init__(
        self, collate: Callable[[Any], Any] | None, digest: bool = False, own_errors: bool = False
    ) -> None:
        self.collate = collate or default_collate
        self.digest = digest  # the first batch's first sample, per worker
        # The user's errors as they are (watch: their script sees what it would without it),
        # else in one line of facebench's.
        self.own_errors = own_errors
        self._first = True
        self._memory_at = 0.0
        self._memory_every = MEMORY_EVERY_S

    def __call__(self, samples: Any) -> Carried:
        start = stages.now()
        try:
            batch = self.collate(samples)
        except Exception as error:  # the user's collate: its own message, in one line
            if self.own_errors:
                raise
            raise DataError(f"collate_fn raised {type(error).__name__}: {error}") from error
        stages.lap(stages.COLLATE, start)
        info = get_worker_info()
        digest = _digest(batch) if self.digest and self._first else ""
        self._first = False
        return Carried(batch, stages.take(), info.id if info else -1, digest, self._memory(info))

    def _memory(self, info: Any) -> int:
        now = time.monotonic()
        if info is None or now - self._memory_at < self._memory_every:
            return -1
        found = private_bytes()
        self._memory_at = time.monotonic()
        cost = self._memory_at - now
        self._memory_every = max(MEMORY_EVERY_S, cost / MEMORY_SHARE if MEMORY_SHARE else 0.0)
        return found


def private_bytes() -> int:
    """This process's private memory (its own pages, not those it shares with its parent):
    what grows when a forked worker's reads copy the parent's pages (PyTorch issue 13246)."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as rollup:
            text = rollup.read()
    except OSError:
        return -1
    total = 0
    for line in text.splitlines():
        if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def _digest(batch: Any) -> str:
    tensor = first_tensor(batch)
    if tensor is None or tensor.dim() == 0 or len(tensor) == 0:
        return ""
    sample = tensor[0].detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.blake2b(sample.numpy().tobytes(), digest_size=8).hexdigest()


def first_tensor(batch: Any, key: str = "") -> torch.Tensor | None:
    """The tensor a batch is counted by: `key`'s (a dict's key, or a tuple's index), else a
    tensor batch itself, or the first tensor of a tuple, list or dict."""
    if key:
        try:
            found = batch[int(key)] if isinstance(batch, list | tuple) else batch[key]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        return found if isinstance(found, torch.Tensor) else None
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, list | tuple) or isinstance(batch, Mapping):
        for value in values:
            if isinstance(value, torch.Tensor):
                return value
    return None
