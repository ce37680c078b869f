"""Decoding one sample as the seed did, shared by every loader and by prepare.py."""

from __future__ import annotations

import io

from PIL import Image

from facebench.data.sources import CELEBA

# CelebA's aligned faces are framed more loosely than DigiFace1M's: this 128x128 box
# (left, top, right, bottom) brings them to a similar crop, as the seed did.
CELEBA_BOX = (25, 45, 153, 173)


def as_sample(image: Image.Image, source: str) -> Image.Image:
    """An opened image as the seed used it: RGB, and CelebA cropped to 128x128."""
    rgb = image.convert("RGB")
    return rgb.crop(CELEBA_BOX) if source == CELEBA else rgb


def open_sample(path: str, source: str) -> Image.Image:
    """The decoded RGB image of one record: CelebA cropped to 128x128, DigiFace RGBA -> RGB."""
    with Image.open(path) as image:
        return as_sample(image, source)


def decode_sample(data: bytes, source: str) -> Image.Image:
    """The same from a file's bytes (as read from a tar shard)."""
    with Image.open(io.BytesIO(data)) as image:
        return as_sample(image, source)
