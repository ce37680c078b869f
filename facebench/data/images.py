"""Decoding one sample as the article did, shared by every loader and by prepare.py.

A file that cannot be decoded raises DataError naming it, in whichever process decodes it; the
DataLoader carries that to the main process, which reports it in one line.
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

from facebench.data.sources import CELEBA
from facebench.errors import DataError

# CelebA's aligned faces are framed more loosely than DigiFace1M's: this 128x128 box
# (left, top, right, bottom) brings them to a similar crop, as the article did.
CELEBA_BOX = (25, 45, 153, 173)
_DECODE_ERRORS = (OSError, UnidentifiedImageError, SyntaxError, ValueError)


def as_sample(image: Image.Image, source: str) -> Image.Image:
    """An opened image as the article used it: RGB (from grey, palette or RGBA), CelebA cropped."""
    rgb = image.convert("RGB")
    return rgb.crop(CELEBA_BOX) if source == CELEBA else rgb


class BadImage(DataError):
    """An image file that cannot be decoded; `reason` says why, without the advice.

    Constructible from the message alone, as the DataLoader does when it re-raises an error from
    a worker in the main process.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message, reason)
        self.reason = reason


def bad_image(path: str, error: Exception) -> BadImage:
    reason = f"cannot decode this image ({type(error).__name__}: {error})"
    return BadImage(
        f"{path}: {reason}. Replace or remove the file, or run with on_bad_sample=skip to leave "
        "such files out",
        reason,
    )


def open_sample(path: str, source: str) -> Image.Image:
    """The decoded RGB image of one record: CelebA cropped to 128x128, DigiFace RGBA -> RGB."""
    try:
        with Image.open(path) as image:
            return as_sample(image, source)
    except FileNotFoundError:
        raise DataError(
            f"{path}: image not found (listed in the labels or found earlier). Restore it, or "
            "run with on_bad_sample=skip"
        ) from None
    except _DECODE_ERRORS as error:
        raise bad_image(path, error) from None


def decode_sample(data: bytes, source: str, name: str = "<bytes>") -> Image.Image:
    """The same from a file's bytes (as read from a tar shard); `name` is used in errors."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return as_sample(image, source)
    except _DECODE_ERRORS as error:
        raise bad_image(name, error) from None
