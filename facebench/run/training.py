"""The model, its optimizer and mixed precision: one training step of an image classifier."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torchvision

from facebench.host.device import Precision


@dataclass
class Trainer:
    """One training step, in channels_last and mixed precision, on tensors already on the device.

    The step never reads a value back from the device (no `.item()`): such a read waits for the
    GPU and would hide exactly the stalls facebench measures. The loss stays on the device.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    criterion: torch.nn.Module
    scaler: torch.amp.GradScaler
    precision: Precision
    device: torch.device

    def step(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        images = images.contiguous(memory_format=torch.channels_last)  # a no-op when it is
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
    if device.type == "cuda":
        # Every batch has the same shape: cuDNN's autotuning, done in the first (warm-up)
        # steps, picks the fastest kernels for the rest.
        torch.backends.cudnn.benchmark = True
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
