"""What the epoch loop does with each batch it receives: what it keeps of it (ids, labels, the
first and last loss), and what it does next (finish it on the device and train on it, nothing
more when host only, or an emulated accelerator's step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from facebench.loaders.shared import Batch
from facebench.measure.meter import DeviceBusy
from facebench.measure.order import order_metrics
from facebench.measure.timeline import LoopTimeline
from facebench.run.accelerator import EmulatedSteps
from facebench.run.finish import Finisher, Ready
from facebench.run.training import Trainer


@dataclass
class Seen:
    """What the epoch delivered: copies of ids and labels (see `add`), the first and last loss."""

    ids: list[np.ndarray] = field(default_factory=list)
    labels: list[np.ndarray] = field(default_factory=list)
    first_loss: torch.Tensor | None = None
    last_loss: torch.Tensor | None = None

    def add(self, batch: Batch) -> None:
        if batch.ids is None:
            return
        # Copies, not the tensors: a tensor received from a worker process holds an open file
        # descriptor for as long as it lives (torch's default sharing strategy), so keeping them
        # for the epoch would exhaust a 1,024-descriptor limit after about 1,000 batches.
        self.ids.append(batch.ids.numpy().copy())
        self.labels.append(batch.labels.numpy().copy())

    def loss(self, loss: torch.Tensor) -> None:
        self.last_loss = loss
        if self.first_loss is None:
            self.first_loss = loss

    def outcome(self, label_counts: np.ndarray | None) -> dict[str, Any]:
        """EpochResult's fields from what was seen: order metrics, ids, first and last loss."""
        return {
            "order": order_metrics(self.ids, self.labels, label_counts),
            "ids": np.concatenate(self.ids) if self.ids else None,
            "loss_first": self.first_loss.item() if self.first_loss is not None else None,
            "loss_last": self.last_loss.item() if self.last_loss is not None else None,
        }


@dataclass
class BatchUse:
    """What the loop does with a batch it received: finish it on the device, train on it; or,
    host only, nothing more, or an emulated accelerator's step."""

    trainer: Trainer | None
    finish: Finisher
    busy: DeviceBusy
    seen: Seen
    timeline: LoopTimeline
    host_only: bool = False
    emulated: EmulatedSteps | None = None

    def tail(self) -> str:
        """What the loop's time after its last mark was: the device finishing the work queued
        last (the clock synchronized it), or, host only, the handover."""
        return "handover" if self.host_only else "step" if self.trainer is not None else "finish"

    def end(self) -> None:
        """After the last batch: emulated steps still computing (sync=none) waited for, as a
        host synchronizes before it reads the clock; the loader's last `next` counted as its
        own, the rest as the step's."""
        if self.emulated is not None:
            self.emulated.finish()
            self.timeline.arrived("step")

    def __call__(self, batch: Batch, ready: Ready | None) -> None:
        if self.emulated is not None:
            self.emulated.step(len(batch.labels))
            self.timeline.mark("step")
            return
        if self.host_only:
            return
        with self.busy.step():
            images, labels = ready or self.finish(batch)
            self.timeline.mark("finish")
            if self.trainer is not None:
                self.seen.loss(self.trainer.step(images, labels))
                self.timeline.mark("step")
