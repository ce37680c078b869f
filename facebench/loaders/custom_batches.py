"""loader=custom's batches as the epoch loop takes them: each one counted by a tensor it holds,
its producer's stage times unpacked, and what it carried for the pipeline's checks observed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from facebench.custom.carrier import Carried, first_tensor
from facebench.custom.checks import Observed
from facebench.errors import ConfigError, DataError, FacebenchError
from facebench.loaders.shared import Batch

_LABEL_KEYS = ("label", "labels", "target", "targets", "y")


class Unwrapped:
    """The pipeline's batches as Batches; `epoch_metrics` (which the epoch loop asks for once
    it ends) says what was seen of the pipeline and warns where it misbehaved."""

    def __init__(
        self, pipeline: Iterable[Any], observed: Observed, key: str = "", for_model: bool = False
    ) -> None:
        self.pipeline = pipeline
        self.observed = observed
        self.key = key
        self.for_model = for_model

    def __iter__(self) -> Iterator[Batch]:
        name = self.observed.name
        for item in _one_line_errors(self.pipeline, name):
            if isinstance(item, Carried):
                batch = to_batch(item.batch, self.key, self.for_model, name)
                self.observed.add(len(batch.labels), item)
                yield batch._replace(stages=item.stages)
            else:
                batch = to_batch(item, self.key, self.for_model, name)
                self.observed.add(len(batch.labels), None)
                yield batch

    def epoch_metrics(self) -> dict[str, float]:
        return self.observed.conclude()


def _one_line_errors(pipeline: Iterable[Any], name: str) -> Iterator[Any]:
    """The pipeline's items; an error its code raised in a DataLoader worker (which torch
    passes on with the worker's traceback in its message) as one line with its own message.
    facebench's own errors, and a worker's death (said by the epoch loop), pass as they are."""
    try:
        yield from pipeline
    except FacebenchError:
        raise
    except Exception as error:
        text = str(error)
        if "Original Traceback" not in text:
            raise
        last = text.strip().splitlines()[-1]
        raise DataError(f"loader={name}: a worker raised {last}") from error


def to_batch(batch: Any, key: str = "", for_model: bool = False, name: str = "custom") -> Batch:
    """A user's batch as a Batch: its images the tensor it is counted by, its labels the first
    one-dimensional integer tensor of as many after it (a dict's label key), else zeros that
    nothing reads; no ids (facebench has no records of the user's samples)."""
    images = first_tensor(batch, key)
    if images is None or images.dim() == 0:
        where = f"loader.batch_size_from={key} names" if key else "it holds"
        raise DataError(
            f"loader={name}: a batch is a {_shape(batch)} and {where} no tensor to count its "
            "samples by; name the one to count with loader.batch_size_from=<dict key or "
            "tuple index>"
        )
    n = len(images)
    labels = _labels(batch, images, n)
    if for_model:
        _check_for_model(images, labels, name)
    return Batch(images, labels if labels is not None else torch.zeros(n, dtype=torch.int64), None)


def _labels(batch: Any, images: torch.Tensor, n: int) -> torch.Tensor | None:
    if isinstance(batch, Mapping):  # a dict, or a UserDict (Hugging Face's BatchEncoding)
        candidates = [batch[key] for key in _LABEL_KEYS if key in batch]
    elif isinstance(batch, list | tuple):
        candidates = list(batch)
    else:
        return None
    for value in candidates:
        if (
            isinstance(value, torch.Tensor)
            and value is not images
            and value.dim() == 1
            and len(value) == n
            and not value.is_floating_point()
        ):
            return value
    return None


def _check_for_model(images: torch.Tensor, labels: torch.Tensor | None, name: str) -> None:
    shape = "x".join(str(side) for side in images.shape)
    if images.dim() != 4 or images.shape[1] != 3 or not images.is_floating_point():
        raise ConfigError(
            f"loader={name} with a model: the model takes float (N, 3, H, W) images, and the "
            f"batches hold {images.dtype} {shape}; measure the loader alone with model=none "
            "host_only=true, or an emulated accelerator (accelerator=h100)"
        )
    if labels is None:
        raise ConfigError(
            f"loader={name} with a model: the batches hold no (N,) integer labels beside the "
            f"{shape} images; measure the loader alone with model=none host_only=true, or an "
            "emulated accelerator (accelerator=h100)"
        )


def _shape(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return f"{type(batch).__name__} with keys {', '.join(map(str, batch))}"
    if isinstance(batch, list | tuple):
        return f"{type(batch).__name__} of {', '.join(type(item).__name__ for item in batch)}"
    return type(batch).__name__
