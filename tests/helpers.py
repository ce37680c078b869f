"""Test helpers: what a loader should deliver, computed the slow, obvious way."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

import torch

from facebench.data.images import open_sample
from facebench.data.sources import read_records
from facebench.data.transforms import seed_transform


def fingerprint(image: torch.Tensor) -> str:
    # Rounded so that float noise in a batched path does not change the identity of a sample.
    rounded = torch.round(image.float() * 1000).to(torch.int32).contiguous()
    return hashlib.sha1(rounded.numpy().tobytes()).hexdigest()


def delivered(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Counter:
    """The multiset of (image fingerprint, label) a loader yielded over one epoch."""
    seen: Counter = Counter()
    for images, labels, _ in batches:
        for image, label in zip(images, labels, strict=True):
            seen[(fingerprint(image), int(label))] += 1
    return seen


def expected(root) -> Counter:
    """Every sample of the tree, decoded and center-cropped directly, once each."""
    transform = seed_transform("center")
    records, _ = read_records(root)
    return Counter(
        (fingerprint(transform(open_sample(r.path, r.source))), r.label) for r in records
    )
