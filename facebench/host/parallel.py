"""Running a function over many items in worker processes, for the long preparation steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from facebench.host.resources import usable_cores

T = TypeVar("T")
R = TypeVar("R")


def map_in_processes(function: Callable[[T], R], items: Sequence[T], n_procs: int) -> Iterator[R]:
    """function(item) for each item, in order: in this process when one process is enough
    (no pool to start), otherwise in up to n_procs worker processes (never more than cores)."""
    n_procs = max(1, min(n_procs, usable_cores(), len(items)))
    if n_procs == 1:
        yield from map(function, items)
        return
    pool = ProcessPoolExecutor(max_workers=n_procs)
    try:
        yield from pool.map(function, items)
    finally:
        # After an error (a full disk, say) or an early stop, the tasks not started yet are
        # dropped rather than all run to their end.
        pool.shutdown(wait=True, cancel_futures=True)
