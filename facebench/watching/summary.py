"""What `watch` says when a loop ends: train.py's epoch lines, then the headline (how long the GPU,
or the loop, waited for data, and where the workers' time went), and what to run next to measure
the same Dataset with facebench's sweep and an emulated accelerator."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from facebench import stages
from facebench.measure.epoch_lines import log_epoch

log = logging.getLogger("facebench.watch")

_SHOWN_PARTS = 6  # the costliest stages and transforms the headline names


def ensure_console() -> None:
    """watch speaks through logging; in a script that set up none, Python would show its
    warnings only: then a handler of its own on facebench's logger, once."""
    ours = logging.getLogger("facebench")
    if logging.getLogger().handlers or ours.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[facebench] %(message)s"))
    ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)


def say_epoch(step: int, metrics: Mapping[str, float], in_flight: int) -> None:
    """An epoch's lines, as a train.py run prints them."""
    log_epoch(step, dict(metrics), in_flight)


def headline(metrics: Mapping[str, float]) -> str:
    """'the GPU waited for data 37% of the epoch; inside the workers: load 44%, ...'."""
    if "gpu_data_wait_frac" in metrics:
        said = f"the GPU waited for data {metrics['gpu_data_wait_frac']:.0%} of the epoch"
    else:
        said = f"the loop waited for data {metrics['data_wait_frac']:.0%} of the epoch"
    inside = inside_workers(metrics)
    return f"{said}; inside the workers: {inside}" if inside else said


def inside_workers(metrics: Mapping[str, float]) -> str:
    """The workers' stages by their share of the workers' time (the transforms by name, where
    they were timed one by one), costliest first."""
    shares = {
        name: metrics[f"stage_{name}_frac"]
        for name in stages.WORKER_STAGES
        if metrics.get(f"stage_{name}_frac", 0.0) > 0.0
    }
    named = dict(stages.parts(metrics))
    if named and "transform" in shares:
        shares.pop("transform")
        shares.update(named)
    shown = sorted(shares.items(), key=lambda item: -item[1])[:_SHOWN_PARTS]
    return ", ".join(f"{name} {share:.0%}" for name, share in shown if share >= 0.005)


def next_command(loader: Any, accelerator: str = "h100") -> str:
    """The command that measures a DataLoader's Dataset with facebench's sweep, or why there is
    none; "" for an iterable that is not a DataLoader."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return ""
    inner = dataset
    while type(inner).__name__ in ("Subset", "ConcatDataset") and hasattr(inner, "dataset"):
        inner = inner.dataset
    cls = type(inner)
    if cls.__module__ == "__main__":
        return (
            f"to measure {cls.__name__} with facebench's sweep and an emulated accelerator, "
            "move it (or a function that builds it as your script does) into a module, then: "
            f"python train.py loader=custom loader.dataset._target_=<module>.{cls.__name__} "
            f"accelerator={accelerator}"
        )
    root = getattr(inner, "root", None)
    named = isinstance(root, str | os.PathLike)
    argument = f" +loader.dataset.root={os.fspath(root)}" if named else ""
    workers = f" n_workers={loader.num_workers}" if hasattr(loader, "num_workers") else ""
    size = getattr(loader, "batch_size", None)
    batch = f" batch_size={size}" if size else ""
    return (
        "to measure it with facebench's sweep and an emulated accelerator: python train.py "
        f"loader=custom loader.dataset._target_={cls.__module__}.{cls.__qualname__}{argument}"
        f"{workers}{batch} accelerator={accelerator} (its transform as your script builds "
        "it: give _target_ a function of yours that returns the dataset)"
    )
