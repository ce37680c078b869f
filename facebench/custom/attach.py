"""Probes put on a user's own DataLoader in place, and taken off again: its datasets'
transforms timed (through a Subset or ConcatDataset too), a map-style dataset's samples timed
where its fetcher asks for a batch's at once, its collate a Carrier (facebench/custom/
carrier.py). loader=custom attaches them for good; `watch` (facebench/watching/) detaches them
when it ends, so that the user's loader is as it was.

A DataLoader whose workers already run (persistent_workers=True, after its first epoch) cannot
be reached: its workers hold the dataset and collate they were started with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from facebench.custom.carrier import Carrier
from facebench.custom.probes import Undo, instrument, time_in_place

# Set on a DataLoader whose persistent workers were started with a Carrier: they carry for good.
_CARRYING = "_facebench_carrying"
_DEPTH = 4  # datasets inside datasets (a Subset of a ConcatDataset of ImageFolders: 3)


@dataclass
class Attached:
    """What was put on a DataLoader; `detach` puts everything back, in reverse order."""

    reached: bool  # the workers' stages are measured
    why_not: str = ""  # where not reached: why, in words
    undo: list[Undo] = field(default_factory=list)

    def detach(self) -> None:
        while self.undo:
            self.undo.pop()()


def attach(loader: DataLoader, own_errors: bool = False) -> Attached:
    """Probes on `loader` (see the module's docstring); attached already (the same loader
    another epoch), nothing more. `own_errors`: the user's errors raised as they are."""
    if getattr(loader, "_iterator", None) is not None:  # persistent workers, already started
        return Attached(
            reached=getattr(loader, _CARRYING, False),
            why_not="its persistent workers were started before: they run the dataset and "
            "collate_fn they were given then (watch the loader before its first epoch)",
        )
    undo: list[Undo] = []
    for dataset in nested(loader.dataset):
        undo += instrument(dataset)
    if loader.batch_sampler is not None:  # the fetcher asks for a batch's samples at once
        undo += time_in_place(loader.dataset, own_errors)
    if not isinstance(loader.collate_fn, Carrier):
        original = loader.collate_fn
        digest = isinstance(loader.dataset, IterableDataset) and loader.num_workers > 1
        loader.collate_fn = Carrier(original, digest=digest, own_errors=own_errors)
        undo.append(lambda: setattr(loader, "collate_fn", original))
        if loader.persistent_workers:  # its workers, started now, carry for good
            setattr(loader, _CARRYING, True)
    return Attached(reached=True, undo=undo)


def nested(dataset: Any, depth: int = _DEPTH) -> Iterator[Any]:
    """A dataset and those it wraps (a Subset's `dataset`, a ConcatDataset's `datasets`), each
    once: where a random_split leaves the transforms."""
    seen: set[int] = set()
    pending = [(dataset, 0)]
    while pending:
        current, level = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if level >= depth:
            continue
        inner = getattr(current, "dataset", None)
        if inner is not None:
            pending.append((inner, level + 1))
        several = getattr(current, "datasets", None)
        if isinstance(several, list | tuple):
            pending.extend((each, level + 1) for each in several)
