"""Progress for long work: a bar on a terminal, a few log lines elsewhere (CI, log files)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(
    items: Iterable[T],
    total: int,
    description: str,
    unit: str = "it",
    log: logging.Logger | None = None,
) -> Iterator[T]:
    """Yield items, showing progress: tqdm on a terminal, otherwise a log line every 10%."""
    if sys.stderr.isatty():
        yield from tqdm(items, total=total, desc=description, unit=unit, dynamic_ncols=True)
        return
    logger = log or logging.getLogger(__name__)
    next_report = 0.1
    for done, item in enumerate(items, start=1):
        yield item
        if total and done / total >= next_report:
            logger.info("%s: %d/%d %s (%.0f%%)", description, done, total, unit, 100 * done / total)
            next_report = (int(10 * done / total) + 1) / 10


class _Quiet:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def epoch_progress(total_images: int | None, description: str):
    """A live images/s bar for the epoch on a terminal; nothing elsewhere (logs stay clean)."""
    if not sys.stderr.isatty():
        return _Quiet()
    return tqdm(
        total=total_images,
        desc=description,
        unit="img",
        unit_scale=True,
        dynamic_ncols=True,
        leave=False,
    )
