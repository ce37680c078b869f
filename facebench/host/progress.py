"""Progress for long work: a bar on a terminal, a log line every 30 s elsewhere (CI, nohup,
SLURM, a file), so that output sent anywhere but a terminal still shows the work going on.

An epoch's lines come every 30 s also while one batch takes longer than that (ResNet-50 on a
CPU takes about a minute for a batch of 600): a thread says so when no batch came in time."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")

LOG_EVERY_S = 30.0  # between two progress lines when the output is not a terminal


def _duration(seconds: float) -> str:
    """'45 s', '12 min', '3.2 h': how long, to the precision a progress line needs."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class ProgressLog:
    """Counts work done and logs a line at a steady interval: done of total, rate, time left.

    The first line comes one interval after the start (short work logs nothing); `close` logs a
    last line if any was logged before, so that a log's last word on the work is its end. With
    `heartbeat`, a thread logs a line whenever one is due and no work was done meanwhile
    (`close` stops it).
    """

    def __init__(
        self,
        total: int | None,
        description: str,
        unit: str,
        log: logging.Logger | None = None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: bool = False,
    ) -> None:
        self.total = total
        self.description = description
        self.unit = unit
        self.log = log or logging.getLogger(__name__)
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.clock = clock
        self.started = clock()
        self.next_at = self.started + self.every_s
        self.done = 0
        self.lines = 0
        self.logged = 0  # work done at the last line
        self._lock = threading.Lock()  # the heartbeat's thread and the worker's take turns
        self._closed = threading.Event()
        if heartbeat:
            threading.Thread(target=self._beat, name="progress", daemon=True).start()

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            self._due(self.clock())

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self.lines and self.done != self.logged:  # the end, unless the last line said it
                self._line(self.clock())

    def _due(self, now: float) -> None:
        if now >= self.next_at:
            self._line(now)
            self.next_at = now + self.every_s

    def _beat(self) -> None:
        # At least 50 ms between looks: with every_s=0 (tests), every look is due.
        while not self._closed.wait(max(0.05, self.next_at - self.clock())):
            with self._lock:
                if not self._closed.is_set():
                    self._due(self.clock())

    def _line(self, now: float) -> None:
        self.lines += 1
        self.logged = self.done
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        text = f"{self.description}: {self.done:,} {self.unit}"
        if self.total:
            text += f" of {self.total:,} ({100 * self.done / self.total:.0f}%)"
        text += f", {rate:,.1f} {self.unit}/s, {_duration(elapsed)} so far"
        if self.total and 0 < self.done < self.total and rate > 0:
            text += f", about {_duration((self.total - self.done) / rate)} left"
        self.log.info("%s", text)


def on_terminal() -> bool:
    """Whether a person watches the output: a bar then. Hydra's log lines go to stdout and the
    bar to stderr; if either is sent elsewhere (a file, a pipe), the work is logged instead."""
    return sys.stderr.isatty() and sys.stdout.isatty()


def progress(
    items: Iterable[T],
    total: int,
    description: str,
    unit: str = "it",
    log: logging.Logger | None = None,
) -> Iterator[T]:
    """Yield items, showing progress: tqdm on a terminal, otherwise a ProgressLog."""
    if on_terminal():
        yield from tqdm(items, total=total, desc=description, unit=unit, dynamic_ncols=True)
        return
    lines = ProgressLog(total, description, unit, log)
    for item in items:
        yield item
        lines.update()
    lines.close()


def epoch_progress(
    total_images: int | None, description: str, log: logging.Logger | None = None
) -> tqdm | ProgressLog:
    """A live images/s bar for the epoch on a terminal; a ProgressLog elsewhere."""
    if not on_terminal():
        return ProgressLog(total_images, description, "images", log, heartbeat=True)
    return tqdm(
        total=total_images,
        desc=description,
        unit="img",
        unit_scale=True,
        dynamic_ncols=True,
        leave=False,
    )
