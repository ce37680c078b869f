"""`watch(loader)`: a user's own training loop measured where it runs, its batches passed through
unchanged (the same objects, in the same order, nothing copied, no device synchronization but at
an epoch's start and end).

    from facebench import watch
    for images, labels in watch(train_loader):
        ...the step...

Each epoch is measured as train.py measures its own (facebench/watching/epoch.py); when the loop
ends (the loader exhausted, a `break`, an exception, Ctrl-C, or `close()`), its lines are said
and its run recorded (facebench/watching/record.py) with the status the ending gives
(facebench/watching/ending.py). The user's exception propagates unchanged; nothing of facebench's
own raises into the loop: what it cannot measure it says in one line.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import sys
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from facebench import stages
from facebench.custom.checks import Observed
from facebench.watching.ending import INTERRUPTS, Ending, of_closed_loop, of_error, uncaught
from facebench.watching.epoch import WatchedEpoch
from facebench.watching.ranks import pooled, rank_and_size
from facebench.watching.reach import Reach
from facebench.watching.record import record_for
from facebench.watching.summary import ensure_console, headline, next_command, say_epoch

log = logging.getLogger("facebench.watch")

_ENDS = itertools.count()  # watches ended in this process: every rank counts alike


class Watch:
    """An iterable over the loader's batches that measures them; iterate it again for more
    epochs of the same run. Also a context manager: `with watch(loader) as batches:` gives the
    run's status exactly, from the exception that left the block."""

    def __init__(
        self,
        loader: Iterable[Any],
        epochs: int = 1,
        experiment: str | None = None,
        run_name: str | None = None,
        tracking: bool = True,
        folder: str | Path | None = None,
        batch_size_from: str = "",
        device: torch.device | str | None = None,
    ) -> None:
        self.loader = loader
        self.epochs = max(1, int(epochs))
        self.key = str(batch_size_from)
        self.device = _device(device)
        self.reach = Reach(loader)
        ensure_console()
        self.rank, self.world_size = rank_and_size()
        settings = {
            "epochs": self.epochs,
            "device": str(self.device),
            "world_size": self.world_size,
        }
        # Only rank 0 records in MLflow.
        self.record = record_for(
            loader, run_name, experiment, tracking and self.rank == 0, folder, settings
        )
        self.metrics: dict[str, float] = {}  # the last epoch's, once it ended
        self._epoch: WatchedEpoch | None = None
        self._measured: list[dict[str, float]] = []  # epochs not yet recorded
        # The loop's iterator, held weakly: a loop that lets go of it (a break) closes it at
        # once, which a reference from here (the iterator's frame holds this watch) would stop.
        self._active: weakref.ref[Iterator[Any]] | None = None
        self._told: Ending | None = None  # an ending known for sure (close, __exit__)
        self._in_block = False
        _close_at_exit(self)

    def __iter__(self) -> Iterator[Any]:
        batches = self._batches()
        self._active = weakref.ref(batches)
        return batches

    def _batches(self) -> Iterator[Any]:
        self._told = None
        INTERRUPTS.install()
        for index in range(self.epochs):
            batches = self._begin()
            if batches is None:  # watch could not start: the loader's batches, unmeasured
                yield from self.loader
                continue
            try:
                # Not `yield from`: that would close the epoch's batches (and shut the workers
                # down) before the clock could stop where the loop ended.
                for batch in batches:  # noqa: UP028
                    yield batch
            except GeneratorExit:  # the loop stopped asking: a break, an exception, close()
                told = self._told or of_closed_loop(sys._getframe(1), INTERRUPTS)
                self._end(told, batches)
                return
            except BaseException as error:  # from the loader itself: the user's, unchanged
                self._end(of_error(error), batches)
                raise
            self._end(Ending.EXHAUSTED, batches, last=index == self.epochs - 1)

    def __len__(self) -> int:
        """Batches in all its epochs, where the loader has a length (for a progress bar)."""
        return len(self.loader) * self.epochs  # type: ignore[arg-type]

    def _begin(self) -> Iterator[Any] | None:
        """The epoch started, its batches; None, said in one line, where watch cannot start."""
        try:
            return self._started()
        except Exception as error:
            _failed(error)
            self._finish(Ending.CLOSED)  # the probes off, the interrupts handler back
            return None

    def _started(self) -> Iterator[Any]:
        why_not = self.reach.attach()
        if why_not and not self._measured and not self.record.results.epochs:
            log.info("watch: inside the workers not measured: %s", why_not)
        observed = Observed(
            "watch",
            self.reach.n_workers,
            self.reach.iterable_dataset,
            _length(self.loader),
            who="watch",
        )
        self._epoch = WatchedEpoch(self.reach, self.device, self.key, observed)
        self._epoch.start()
        return self._epoch.batches()

    def _end(self, how: Ending, batches: Iterator[Any], last: bool = True) -> None:
        """The epoch's clock stopped where the loop ended; said and recorded on its last."""
        try:
            # The clock stops first: letting go of the loader's iterator then shuts its workers
            # down (as without watch), which may take seconds that are not the loop's.
            metrics = self._epoch.end() if self._epoch is not None else {}
        except Exception as error:
            _failed(error)
            metrics = {}
        finally:
            self._epoch = None
            batches.close()
        try:
            if metrics:
                step = len(self.record.results.epochs) + len(self._measured)
                self.metrics = metrics
                self._measured.append(metrics)
                if self.rank == 0:
                    say_epoch(step, metrics, self.reach.in_flight)
                self._said_uncounted(metrics)
            if last and not (self._in_block and how is not Ending.EXHAUSTED):
                self._finish(how)
        except Exception as error:  # never into the user's loop: their own error matters more
            _failed(error)

    def _said_uncounted(self, metrics: dict[str, float]) -> None:
        if metrics.get("samples_seen", 0) == 0:
            log.warning(
                "watch: the batches hold no tensor to count their samples by: images/s is not "
                "measured; name the one to count with watch(loader, batch_size_from=<dict key "
                "or tuple index>)"
            )

    def _finish(self, how: Ending) -> None:
        """The watch's epochs so far pooled over ranks, said and recorded with `how`'s status;
        never raises."""
        try:
            self._recorded(how)
        except Exception as error:
            _failed(error)

    def _recorded(self, how: Ending) -> None:
        self.reach.detach()
        INTERRUPTS.uninstall()
        measured, self._measured = self._measured, []
        # Every rank hands its epochs to rank 0, none included: the ranks' n-th watches meet.
        epochs = pooled(measured, str(next(_ENDS)))
        if epochs is None:  # another rank's: rank 0 records the job
            return
        if not epochs:
            log.warning("watch: the loader yielded no batch (%s): nothing measured", how.said)
            return
        self.record.add(epochs, how.status)
        last = epochs[-1]
        label = stages.dominant_label(last)
        if label:  # the runs table's column, as train.py's runs have it
            self.record.results.tags["dominant_stage"] = label
        log.info("watch (%s): %s", how.said, headline(last))
        said = next_command(self.loader)
        if said:
            log.info("watch: %s", said)
        self.record.save()

    def close(self) -> None:
        """End the watch now: what it measured is said and recorded (FINISHED)."""
        self._told = self._told or Ending.CLOSED
        active = self._active() if self._active is not None else None
        self._active = None
        if active is not None:
            active.close()  # a loop suspended mid-epoch: its epoch ends, and is recorded
        if self._measured:  # ended inside a `with` block: recorded now, its status known
            self._finish(self._told)

    def __enter__(self) -> Watch:
        self._in_block = True
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self._told = of_error(error) if error is not None else Ending.LEFT
        self._in_block = False
        self.close()


def watch(
    loader: Iterable[Any],
    *,
    epochs: int = 1,
    experiment: str | None = None,
    run_name: str | None = None,
    tracking: bool = True,
    folder: str | Path | None = None,
    batch_size_from: str = "",
    device: torch.device | str | None = None,
) -> Watch:
    """Measure `loader` in the loop that iterates it (see the module's docstring).

    epochs: loops over the loader in one go. experiment, run_name: the MLflow run's (nested
    under the script's active run, if any). tracking=False: results.json only. folder: where
    results.json goes (outputs/watch/<time>-<run name>). batch_size_from: the dict key or tuple
    index of the tensor a batch is counted by (its first tensor). device: where the step runs
    (the current CUDA device where CUDA is in use, else the CPU).
    """
    return Watch(loader, epochs, experiment, run_name, tracking, folder, batch_size_from, device)


def _failed(error: Exception) -> None:
    """A failure of watch's own, in one line (its traceback at DEBUG): the script goes on."""
    log.error("watch: the measurement could not be completed: %s: %s", type(error).__name__, error)
    log.debug("watch's failure", exc_info=error)


def _device(device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _length(loader: Any) -> int | None:
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:
        return None


def _close_at_exit(watched: Watch) -> None:
    """A watch still open as the script exits (its loop kept suspended) is ended then, with the
    status an uncaught exception gave the script, if one did."""
    reference = weakref.ref(watched)

    def close() -> None:
        still = reference()
        if still is not None and (still._active is not None or still._measured):
            still._told = uncaught() or Ending.CLOSED
            still.close()

    atexit.register(close)
