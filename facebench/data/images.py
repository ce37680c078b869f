"""Decoding one sample as the seed did, shared by every loader and by prepare.py."""

from __future__ import annotations

from PIL import Image

from facebench.data.sources import CELEBA

# CelebA's aligned faces are framed more loosely than DigiFace1M's: this 128x128 box
# (left, top, right, bottom) brings them to a similar crop, as the seed did.
CELEBA_BOX = (25, 45, 153, 173)


def open_sample(path: str, source: str) -> Image.Image:
    """The decoded RGB image of one record: CelebA cropped to 128x128, DigiFace RGBA -> RGB."""
    with Image.open(path) as image:
        rgb = image.convert("RGB")
    if source == CELEBA:
        return rgb.crop(CELEBA_BOX)
    return rgb
