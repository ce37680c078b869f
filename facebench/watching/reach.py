"""What `watch` reaches of the iterable it is given: on a DataLoader, inside its workers (the
probes loader=custom puts on, facebench/custom/attach.py), each batch's stage times taken off
it before the user's loop sees it; on anything else, the batches only.

A batch from a probed DataLoader comes out of its collate as a `Carried`; the DataLoader's
iterator hands the user's own batch on, the Carried kept aside (`Unwrap`, set on the iterator:
a persistent-workers iterator keeps it for the epochs after watch, whose workers still carry).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from torch.utils.data import DataLoader, IterableDataset

from facebench import stages
from facebench.custom.attach import Attached, attach
from facebench.custom.carrier import Carried


class Arrival(NamedTuple):
    """A batch as the user's loop gets it, with what its producer measured (None where the
    workers were not reached)."""

    batch: Any
    stages: stages.StageTimes | None
    carried: Carried | None


class Unwrap:
    """A DataLoader iterator's `_next_data`: the user's batch out of a Carried, which is kept.

    It holds its iterator weakly, and the class's function rather than the bound method: set on
    the iterator, a strong reference back would make a cycle that keeps the iterator, and its
    worker processes, alive until the garbage collector finds it (the next epoch's workers
    would be forked with it)."""

    def __init__(self, iterator: Any) -> None:
        self.next_data = type(iterator)._next_data
        self.iterator = weakref.ref(iterator)
        self.last: Carried | None = None

    def __call__(self) -> Any:
        data = self.next_data(self.iterator())
        if isinstance(data, Carried):
            self.last = data
            return data.batch
        self.last = None
        return data


class Reach:
    """The watched iterable: a DataLoader probed for the length of the watch, else as is."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable
        self.loader = iterable if isinstance(iterable, DataLoader) else None
        self._attached: Attached | None = None

    @property
    def n_workers(self) -> int:
        return self.loader.num_workers if self.loader is not None else 0

    @property
    def in_flight(self) -> int:
        """Batches the loader starts on at once (the warm-up of the steady rate)."""
        if self.loader is None or not self.loader.num_workers:
            return 0
        return self.loader.num_workers * (self.loader.prefetch_factor or 2)

    @property
    def iterable_dataset(self) -> bool:
        return self.loader is not None and isinstance(self.loader.dataset, IterableDataset)

    def attach(self) -> str:
        """Probes on; why the workers cannot be reached, or ""."""
        if self.loader is None:
            return "it is not a DataLoader: its batches are timed as they arrive"
        if self._attached is not None:  # the watch's next epoch: on already
            return ""
        self._attached = attach(self.loader, own_errors=True)
        return "" if self._attached.reached else self._attached.why_not

    def detach(self) -> None:
        if self._attached is not None:
            self._attached.detach()
            self._attached = None

    def arrivals(self) -> Iterator[Arrival]:
        """The batches, each with its stage times; `iter` is asked first, inside the clock."""
        iterator = iter(self.iterable)
        unwrap = _unwrapping(iterator)
        for data in iterator:
            carried = None
            if unwrap is not None:  # taken, not kept: the batch is the loop's to let go
                carried, unwrap.last = unwrap.last, None
            if carried is None and isinstance(data, Carried):  # an iterator of another kind
                carried, data = data, data.batch
            yield Arrival(data, carried.stages if carried else None, carried)


def _unwrapping(iterator: Any) -> Unwrap | None:
    """The iterator's Unwrap, set on it the first time (torch's DataLoader iterators fetch
    through `_next_data`); None for an iterator that has none."""
    current = getattr(iterator, "__dict__", {}).get("_next_data")
    if isinstance(current, Unwrap):
        return current
    if not callable(getattr(type(iterator), "_next_data", None)):
        return None
    unwrap = Unwrap(iterator)
    try:
        iterator._next_data = unwrap
    except (AttributeError, TypeError):
        return None
    return unwrap
