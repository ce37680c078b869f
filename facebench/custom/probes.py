"""Stage probes inside a user's pipeline, its code unchanged: its dataset's `__getitem__` (or
`__next__`) timed as the `load` stage, its transforms as `transform` (each one of a Compose
under its class name too), its collate as `collate`. The probes wrap the objects' callables;
they are classes at module level, so that workers started by spawn or forkserver get them too.

Where a batch is assembled, facebench/custom/carrier.py's collate takes the stage times to the
loop with it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from facebench import stages
from facebench.errors import DataError


def name_of(transform: Any) -> str:
    """What a transform is called in the records: its class's name, or a function's."""
    if isinstance(transform, Timed | Step):
        return transform.name or name_of(transform.transform)
    name = getattr(transform, "__name__", None) or type(transform).__name__
    return "".join(char if char.isalnum() or char in "_-." else "_" for char in name) or "call"


class Timed:
    """A transform, its time given to the transform stage (wall and CPU) and, `named`, to a
    part of its name too."""

    def __init__(self, transform: Callable[..., Any], named: bool = True) -> None:
        self.transform = transform
        self.name = name_of(transform) if named else ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = stages.now()
        out = self.transform(*args, **kwargs)
        end = stages.lap(stages.TRANSFORM, start)
        if self.name:  # the same span as the stage's
            stages.part(self.name, start[0], end[0])
        return out

    def __repr__(self) -> str:
        return repr(self.transform)

    def __getattr__(self, name: str) -> Any:
        return _forwarded(self, name)


def _forwarded(probe: Any, name: str) -> Any:
    """An attribute a probe lacks, from the transform it wraps (code that reads a Compose's
    `transforms`, or seeds each transform's own random state, still finds them); none while the
    probe is being unpickled, before it holds its transform."""
    wrapped = probe.__dict__.get("transform")
    if wrapped is None:
        raise AttributeError(name)
    return getattr(wrapped, name)


class Step:
    """One step of a Compose whose whole is Timed: its wall time given to a part of its name."""

    def __init__(self, transform: Callable[..., Any]) -> None:
        self.transform = transform
        self.name = name_of(transform)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        out = self.transform(*args, **kwargs)
        stages.part(self.name, start)
        return out

    def __repr__(self) -> str:
        return repr(self.transform)

    def __getattr__(self, name: str) -> Any:
        return _forwarded(self, name)


def timed_transform(transform: Any) -> Any:
    """The transform with its time measured: a Compose (torchvision v1 or v2, or any object
    holding a list in `transforms`) as a copy timed whole, each step under its own name; else
    the whole transform under its name. Already timed: as it is."""
    if transform is None or isinstance(transform, Timed | Step):
        return transform
    steps = getattr(transform, "transforms", None)
    if isinstance(steps, list | tuple) and steps and all(callable(step) for step in steps):
        composed = copy.copy(transform)  # the user's own Compose is left as it was
        composed.transforms = type(steps)(Step(step) for step in steps)
        return Timed(composed, named=False)
    if getattr(transform, "transform", None) is not None and hasattr(transform, "target_transform"):
        # torchvision's StandardTransform (a VisionDataset's `transforms`): its two halves.
        joint = copy.copy(transform)
        joint.transform = timed_transform(transform.transform)
        joint.target_transform = timed_transform(transform.target_transform)
        return joint
    return Timed(transform) if callable(transform) else transform


_TRANSFORM_ATTRIBUTES = ("transform", "target_transform", "transforms")


Undo = Callable[[], None]


def instrument(dataset: Any) -> list[Undo]:
    """Time the transforms a dataset keeps by torchvision's convention (`transform`,
    `target_transform`, `transforms`) or a Hugging Face Dataset's `set_transform`, in place;
    the steps that put each one back."""
    undo: list[Undo] = []
    for attribute in _TRANSFORM_ATTRIBUTES:
        value = getattr(dataset, attribute, None)
        if callable(value) and not isinstance(value, Timed):
            # The instance's own value, or a property's: put back by setting it.
            own = attribute in getattr(dataset, "__dict__", {}) or hasattr(
                getattr(type(dataset), attribute, None), "__set__"
            )
            try:
                setattr(dataset, attribute, timed_transform(value))
            except (AttributeError, TypeError):  # a read-only property: left untimed
                continue
            undo.append(functools.partial(_put_back, dataset, attribute, value, own))
    kwargs = getattr(dataset, "_format_kwargs", None)  # datasets.Dataset.set_transform's
    if isinstance(kwargs, dict) and callable(kwargs.get("transform")):
        undo.append(functools.partial(kwargs.__setitem__, "transform", kwargs["transform"]))
        kwargs["transform"] = timed_transform(kwargs["transform"])
    return undo


def _put_back(dataset: Any, attribute: str, value: Any, own: bool) -> None:
    """An attribute as it was: the instance's own value, or the class's (the probe removed)."""
    if own:
        setattr(dataset, attribute, value)
    else:
        with contextlib.suppress(AttributeError):
            delattr(dataset, attribute)


def load_batch(
    dataset: Any, indices: list[int], batched: bool, own_errors: bool = False
) -> list[Any]:
    """A batch's samples from a map-style dataset, through its class's `__getitems__` where it
    has one (`batched`), else one `__getitem__` each: the time outside their transforms given
    to the `load` stage, taken once for the batch (a thread's CPU clock is a system call, and a
    system call costs its caller more than its own microsecond). An error of the dataset's is
    said in one line naming the samples, or, `own_errors`, raised as it is."""
    inside, start = stages.spent(stages.TRANSFORM), stages.now()
    if batched:
        try:
            out = type(dataset).__getitems__(dataset, indices)
        except Exception as error:  # the user's code: say which samples, with its own message
            if own_errors:
                raise
            shown = ", ".join(map(str, indices[:4])) + (", ..." if len(indices) > 4 else "")
            raise DataError(f"dataset[{shown}] raised {type(error).__name__}: {error}") from error
    else:
        getitem, out = type(dataset).__getitem__, []
        for index in indices:
            try:
                out.append(getitem(dataset, index))
            except Exception as error:  # the user's code: say which sample
                if own_errors:
                    raise
                raise DataError(
                    f"dataset[{index}] raised {type(error).__name__}: {error}"
                ) from error
    _lap_load(start, inside)
    return out


def _lap_load(start: stages.Mark, inside: stages.Mark) -> None:
    """The time since `start` to the load stage, less what the transforms took meanwhile
    (`inside`: their stage's time as it began), which is theirs."""
    after = stages.spent(stages.TRANSFORM)
    stages.lap(stages.LOAD, start, (after[0] - inside[0], after[1] - inside[1]))


class TimedSamples(Dataset):
    """A map-style dataset whose samples' time is the `load` stage (outside their transforms):
    the DataLoader asks for a batch's at once (`__getitems__`)."""

    def __init__(self, dataset: Any, own_errors: bool = False) -> None:
        self.dataset = dataset
        self.batched = callable(getattr(type(dataset), "__getitems__", None))
        self.own_errors = own_errors

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return load_batch(self.dataset, [index], False, self.own_errors)[0]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return load_batch(self.dataset, indices, self.batched, self.own_errors)


class TimedGetItems:
    """A map-style dataset's `__getitems__`, set on the instance of a dataset inside a user's
    own DataLoader (which cannot be given another dataset): its fetcher asks for a batch's
    samples through it, timed as TimedSamples times them."""

    def __init__(self, dataset: Any, own_errors: bool = False) -> None:
        self.samples = TimedSamples(dataset, own_errors)

    def __call__(self, indices: list[int]) -> list[Any]:
        return self.samples.__getitems__(indices)


def time_in_place(dataset: Any, own_errors: bool = False) -> list[Undo]:
    """Time the samples of a map-style dataset that a user's DataLoader holds, where it can be
    (not an IterableDataset, whose iterator is the class's own; not a read-only object); the
    step that takes the probe off."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        return []
    if isinstance(getattr(dataset, "__dict__", {}).get("__getitems__"), TimedGetItems):
        return []  # the same dataset, another epoch
    try:
        dataset.__getitems__ = TimedGetItems(dataset, own_errors)
    except (AttributeError, TypeError):
        return []
    return [functools.partial(dataset.__dict__.pop, "__getitems__", None)]


class TimedStream(IterableDataset):
    """An IterableDataset's samples, each `__next__` timed."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        samples = iter(self.dataset)
        position = 0
        while True:
            inside, start = stages.spent(stages.TRANSFORM), stages.now()
            try:
                sample = next(samples)
            except StopIteration:
                return
            except Exception as error:  # the user's code: say which sample
                raise DataError(
                    f"sample {position} of the IterableDataset raised {type(error).__name__}: "
                    f"{error}"
                ) from error
            _lap_load(start, inside)
            yield sample
            position += 1
