"""The last steps before the model: a loader's batch becomes the model's input, on its device.

This is the host / device split of a GPU run. Loaders that finish on the device (raw, webdataset
and nodes with torchvision decoding) hand over uint8 images and crop offsets; here they are
copied to the device (from pinned memory, without waiting), CelebA JPEGs left encoded are decoded
there (nvJPEG), and the batch is cropped and normalized where it now is. `host_only=true` stops
before all of this, exactly where a GPU run would start copying.

On a CPU device the same steps are the host's work, so they run ahead of the loop, in threads of
this process, each with one intra-op thread. Measured on 2 cores (batch 600, in memory): one call
with torch's two intra-op threads, in the loop, finishes 56,000 images/s alone but stalls as
soon as loader threads or workers want the same cores (its threads spin at every barrier); one
thread per batch finishes about 42,000 images/s, two 55,000-61,000, and they overlap with
loading. Each writes into a float buffer that comes back once the loop has moved on: a fresh
72 MB batch costs more in page faults (10-20 ms) than the arithmetic.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from facebench.data.batch_transforms import crop_batch, crop_normalize_on_cpu, normalize_batch
from facebench.data.fast_decode import resize_sample
from facebench.data.sources import CELEBA
from facebench.data.transforms import ARTICLE, Geometry
from facebench.loaders.shared import Batch

_MAX_CPU_THREADS = 4
Ready = tuple[torch.Tensor, torch.Tensor]  # images and labels, as the model takes them

# Batches a CPU device's loop finishes ahead of the one it hands on (each still holds its
# loader's buffer, a worker's shared memory among them).
AHEAD = 2


def batches_held(device: torch.device, host_only: bool) -> int:
    """The loader's batches the epoch loop holds at once: the one in its hands, and on a CPU
    device those it finishes ahead (a GPU run's host side, or host_only, finishes none)."""
    return 1 + (AHEAD if device.type == "cpu" and not host_only else 0)


class Finisher:
    """Batch -> (images, labels) on the device, images as the model takes them, in the loop.

    On a GPU this is the device's work, timed as part of each step. On a CPU the loop uses
    finished_ahead_on_cpu instead; this serves single batches (tests, tools).
    """

    def __init__(self, device: torch.device, geometry: Geometry = ARTICLE) -> None:
        self.device = device
        self.geometry = geometry

    def __call__(self, batch: Batch) -> Ready:
        images = batch.images.to(self.device, non_blocking=True)
        labels = batch.labels.to(self.device, non_blocking=True)
        geometry = self.geometry
        if batch.jpegs is not None:
            images = decode_jpegs_into(images, *batch.jpegs, geometry=geometry)
        if batch.offsets is None:
            return images, labels
        if self.device.type == "cpu":
            shape = (len(images), *geometry.cropped, images.shape[3])
            out = torch.empty(shape, dtype=torch.float32)
            return crop_normalize_on_cpu(images, batch.offsets, out, geometry), labels
        crops = crop_batch(images, batch.offsets, geometry)
        return normalize_batch(crops, geometry=geometry), labels


def decode_jpegs_into(
    images: torch.Tensor, packed: torch.Tensor, index: torch.Tensor, geometry: Geometry = ARTICLE
) -> torch.Tensor:
    """Decode the CelebA JPEGs of a batch on its device (nvJPEG, in one batched call), crop and
    resize them as decode_resized does, and put them in their slots of the uint8 batch."""
    from torchvision.io import ImageReadMode, decode_jpeg

    lengths, slots = index.tolist()
    if lengths:
        encoded = list(torch.split(packed, lengths))
        decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=images.device)
        resized = [resize_sample(image, CELEBA, size=geometry.resized) for image in decoded]
        images[slots] = torch.stack(resized)
    return images


# Float buffers the CPU finishing threads write into, kept from one epoch to the next.
_FREE_BUFFERS: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()


def finished_ahead_on_cpu(
    batches: Iterable[Batch], n_threads: int, ahead: int = AHEAD, geometry: Geometry = ARTICLE
) -> Iterator[tuple[Batch, Ready]]:
    """(batch, (images, labels)) for each batch, uint8 ones cropped and normalized by n_threads
    threads up to `ahead` batches before the loop asks; float ones passed on as they are.

    A yielded batch's float buffer is reused once the loop asks for the next one, in this epoch
    and the next (a new buffer's first touch costs 10-20 ms of page faults).
    """
    free = _FREE_BUFFERS
    pending: deque[tuple[Batch, Future | None]] = deque()
    threads = max(1, min(n_threads, _MAX_CPU_THREADS))
    with ThreadPoolExecutor(
        threads, "finish", initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        try:
            for batch in batches:
                work = (
                    pool.submit(_finish_on_cpu, batch, free, geometry)
                    if batch.offsets is not None
                    else None
                )
                pending.append((batch, work))
                if len(pending) > ahead:
                    yield from _hand_over(pending.popleft(), free)
            while pending:
                yield from _hand_over(pending.popleft(), free)
        finally:
            for _, work in pending:
                if work is not None:
                    work.cancel()


def _hand_over(
    item: tuple[Batch, Future | None], free: queue.SimpleQueue[torch.Tensor]
) -> Iterator[tuple[Batch, Ready]]:
    batch, work = item
    if work is None:
        yield batch, (batch.images, batch.labels)
        return
    buffer, images = work.result()
    yield batch, (images, batch.labels)
    free.put(buffer)  # the loop has asked for the next batch: this one is done with


def _finish_on_cpu(
    batch: Batch, free: queue.SimpleQueue[torch.Tensor], geometry: Geometry
) -> tuple[torch.Tensor, torch.Tensor]:
    n, channels = batch.images.shape[0], batch.images.shape[3]
    shape = (n, *geometry.cropped, channels)
    try:
        buffer = free.get_nowait()
    except queue.Empty:
        buffer = torch.empty(shape, dtype=torch.float32)
    if buffer.shape[1:] != shape[1:] or buffer.shape[0] < n:
        buffer = torch.empty(shape, dtype=torch.float32)
    return buffer, crop_normalize_on_cpu(batch.images, batch.offsets, buffer[:n], geometry)
