"""The model, its optimizer and mixed precision, and the timed epoch loop.

The loop never reads a value back from the device per batch (no `.item()`, no printing the loss):
such a read waits for the GPU and would hide exactly the stalls facebench measures. Losses stay on
the device and are read once, after the clock stops.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torchvision

from facebench.device import Precision
from facebench.loader_failures import explain, quiet_sigchld, restore_sigchld
from facebench.loaders.base import Batch
from facebench.meter import EpochMeter, EpochTimes
from facebench.order import batch_label_diversity, order_corr
from facebench.progress import epoch_progress
from facebench.sampling import ResourceSampler


@dataclass
class Trainer:
    """One training step of an image classifier, in channels_last and mixed precision."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    criterion: torch.nn.Module
    scaler: torch.amp.GradScaler
    precision: Precision
    device: torch.device

    def step(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device, non_blocking=True, memory_format=torch.channels_last)
        targets = targets.to(self.device, non_blocking=True)
        autocast = (
            torch.autocast(self.device.type, dtype=self.precision.dtype)
            if self.precision.dtype is not None
            else nullcontext()
        )
        with autocast:
            loss = self.criterion(self.model(images), targets)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def build_trainer(
    model_name: str,
    n_classes: int,
    device: torch.device,
    precision: Precision,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    distributed: bool = False,
) -> Trainer:
    """A torchvision model from scratch (weights=None: nothing is downloaded) and SGD."""
    model = getattr(torchvision.models, model_name)(weights=None, num_classes=n_classes)
    model = model.to(device, memory_format=torch.channels_last).train()
    if distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    # The fused SGD kernel takes the GradScaler's inf check on the device; the plain one makes
    # GradScaler read it back with .item(), a device sync every step.
    fused = device.type == "cuda"
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused
    )
    return Trainer(
        model=model,
        optimizer=optimizer,
        criterion=torch.nn.CrossEntropyLoss(),
        scaler=torch.amp.GradScaler(device.type, enabled=precision.scale_loss),
        precision=precision,
        device=device,
    )


@dataclass
class EpochResult:
    times: EpochTimes
    resources: dict[str, float]
    order: dict[str, float]
    loss_first: float | None
    loss_last: float | None
    ids: np.ndarray | None = None  # every delivered sample id, in arrival order

    def metrics(self) -> dict[str, float]:
        metrics = {**self.times.metrics(), **self.resources, **self.order}
        if self.loss_first is not None and self.loss_last is not None:
            metrics["loss_first"] = self.loss_first
            metrics["loss_last"] = self.loss_last
        return metrics


def run_epoch(
    build_loader: Callable[[], Iterable[Batch]],
    trainer: Trainer | None,
    device: torch.device,
    max_batches: int = 0,
    sample_hz: float = 4.0,
    label_counts: np.ndarray | None = None,
    expected_images: int | None = None,
    description: str = "epoch",
    join: AbstractContextManager | None = None,
    loader_name: str = "loader",
) -> EpochResult:
    """One timed epoch. `trainer=None` is loader-only mode: batches are only moved to the device.

    The clock starts before the loader is built, so worker start-up counts, as in the seed.
    """
    # A dead worker can surface anywhere in the loop, even in its clean-up (torch's SIGCHLD
    # handler raises wherever the main thread is): the whole epoch is inside the translation.
    try:
        return _timed_epoch(
            build_loader,
            trainer,
            device,
            max_batches,
            sample_hz,
            label_counts,
            expected_images,
            description,
            join,
        )
    except (RuntimeError, OSError, EOFError) as error:
        failure = explain(error, loader_name)
        if failure is None:
            raise
        previous = quiet_sigchld()
    # Past the except block the error and its traceback are gone, and with them the last
    # references to the loader's iterator: its workers shut down now, while torch's SIGCHLD
    # handler (which would raise again, from wherever the main thread is) stays quiet.
    try:
        gc.collect()
    finally:
        restore_sigchld(previous)
    raise failure


def _timed_epoch(
    build_loader: Callable[[], Iterable[Batch]],
    trainer: Trainer | None,
    device: torch.device,
    max_batches: int,
    sample_hz: float,
    label_counts: np.ndarray | None,
    expected_images: int | None,
    description: str,
    join: AbstractContextManager | None,
) -> EpochResult:
    meter = EpochMeter(device)
    sampler = ResourceSampler(device, sample_hz)
    sampler.prepare()  # NVML start-up, outside the clock
    bar = epoch_progress(expected_images, description)
    batches = None
    first_loss: torch.Tensor | None = None
    last_loss: torch.Tensor | None = None
    ids_seen: list[np.ndarray] = []
    labels_seen: list[np.ndarray] = []
    resources: dict[str, float] = {}
    try:
        meter.start()
        sampler.start(meter.started_at)
        # Building the loader (listing files, forking workers) is part of waiting for the first
        # batch: the first wait is counted from the start of the epoch.
        asked_at = meter.started_at
        with join or nullcontext():
            batches = iter(build_loader())
            while True:
                if meter.n_batches:
                    asked_at = meter.waiting()
                try:
                    images, targets, ids = next(batches)
                except StopIteration:
                    break
                meter.batch(asked_at, images.shape[0])
                if ids is not None:
                    # Copies, not the tensors: a tensor received from a worker process holds an
                    # open file descriptor for as long as it lives (torch's default sharing
                    # strategy), so keeping them for the epoch would exhaust a 1,024-descriptor
                    # limit after about 1,000 batches.
                    ids_seen.append(ids.numpy().copy())
                    labels_seen.append(targets.numpy().copy())
                if trainer is None:
                    images.to(device, non_blocking=True)
                    targets.to(device, non_blocking=True)
                else:
                    last_loss = trainer.step(images, targets)
                    if first_loss is None:
                        first_loss = last_loss
                bar.update(images.shape[0])
                if max_batches and meter.n_batches >= max_batches:
                    break
        times = meter.stop()
        resources = sampler.stop(meter.ended_at)  # workers still alive: their counters count
    finally:
        sampler.close()
        bar.close()
        # Shut worker processes down now (the iterator's finalizer does it), not at exit.
        del batches
    all_ids = np.concatenate(ids_seen) if ids_seen else None
    return EpochResult(
        times=times,
        resources=resources,
        order=order_metrics(ids_seen, labels_seen, label_counts),
        ids=all_ids,
        loss_first=first_loss.item() if first_loss is not None else None,
        loss_last=last_loss.item() if last_loss is not None else None,
    )


def order_metrics(
    ids: list[np.ndarray], labels: list[np.ndarray], label_counts: np.ndarray | None
) -> dict[str, float]:
    """Shuffle quality and repeats, from the sample ids the loader reported."""
    if not ids:
        return {}
    all_ids = np.concatenate(ids)
    metrics = {
        "order_corr": order_corr(all_ids),
        "samples_unique": float(len(np.unique(all_ids))),
    }
    if label_counts is not None:
        metrics["batch_label_diversity"] = batch_label_diversity(labels, label_counts)
    return metrics
