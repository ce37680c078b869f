"""Decoding one sample as the article did, shared by every loader and by prepare.py.

A file that cannot be decoded raises DataError naming it, in whichever process decodes it; the
DataLoader carries that to the main process, which reports it in one line.

An image larger than data.max_pixels is a bad sample too, found from its header before anything
is decoded: a PNG of one colour can declare 20,000 x 20,000 pixels in a few hundred KB and ask
for over a GB to decode (a decompression bomb). The limit is set once per job, before any worker
is forked, and so holds in every worker, as PIL's own Image.MAX_IMAGE_PIXELS does; PIL's check
is left off, since this one comes first and names the file.
"""

from __future__ import annotations

import errno
import io

from PIL import Image, UnidentifiedImageError

from facebench import stages
from facebench.config import DataConfig
from facebench.data.sources import CELEBA
from facebench.errors import DataError
from facebench.host.printable import printable
from facebench.storage import client
from facebench.storage.address import in_bucket

# CelebA's aligned faces are framed more loosely than DigiFace1M's: this 128x128 box
# (left, top, right, bottom) brings them to a similar crop, as the article did.
CELEBA_BOX = (25, 45, 153, 173)
_DECODE_ERRORS = (
    OSError,
    UnidentifiedImageError,
    SyntaxError,
    ValueError,
    Image.DecompressionBombError,
)
_max_pixels = DataConfig.max_pixels  # until set_max_pixels, as each job does
Image.MAX_IMAGE_PIXELS = None  # facebench's own check (check_size) comes first


def set_max_pixels(limit: int) -> None:
    """The largest image, in pixels, this process and the workers it forks will decode."""
    global _max_pixels
    _max_pixels = limit


def max_pixels() -> int:
    """The limit set_max_pixels set in this process (for workers that do not inherit it)."""
    return _max_pixels


def within_limit(width: int, height: int) -> bool:
    return not _max_pixels or width * height <= _max_pixels


def check_size(width: int, height: int, path: str) -> None:
    """Refuse an image whose header declares more pixels than data.max_pixels."""
    if not within_limit(width, height):
        reason = (
            f"{width:,} x {height:,} pixels ({width * height / 1e6:,.1f} megapixels) is over "
            f"data.max_pixels={_max_pixels:,}"
        )
        raise BadImage(
            f"{printable(path)}: {reason} (a decompression bomb, or far larger than this data "
            "set's images). Raise data.max_pixels (0 lifts it), or run with on_bad_sample=skip "
            "to leave such files out",
            reason,
        )


def as_sample(image: Image.Image, source: str) -> Image.Image:
    """An opened image as the article used it: RGB (from grey, palette or RGBA), CelebA cropped.

    An RGB CelebA JPEG is cropped as it is, as the article's code does: converting it first
    would copy the whole image for nothing (the crop is a new image either way)."""
    if source == CELEBA:
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        return rgb.crop(CELEBA_BOX)
    return image.convert("RGB")  # a new image, which outlives the file it was read from


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
        f"{printable(path)}: {reason}. Replace or remove the file, or run with "
        "on_bad_sample=skip to leave such files out",
        reason,
    )


def read_file(path: str) -> bytes:
    """A sample's file, whole: a local file, or an object (one GET, counted with the batch)."""
    if in_bucket(path):
        return counted(client.get(path))
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise DataError(
            f"{printable(path)}: image not found (listed in the labels or found earlier). "
            "Restore it, or run with on_bad_sample=skip"
        ) from None
    except IsADirectoryError:
        raise DataError(
            f"{printable(path)}: a folder, not an image file. Point the labels at image files"
        ) from None
    except OSError as error:
        if error.errno in (errno.EMFILE, errno.ENFILE):
            raise  # the process's open files, not this file: loaders/failures.py explains it
        raise bad_image(path, error) from None
    return data


def read_files(paths: list[str]) -> list[bytes]:
    """Several samples' files, in order: objects with several GETs in flight (storage's
    requests_per_worker), local files one after another."""
    if not paths or not in_bucket(paths[0]):
        return [read_file(path) for path in paths]
    return [counted(reply) for reply in client.get_many(paths)]


def counted(reply: client.Reply) -> bytes:
    """A GET's bytes, the GET counted for the batch this thread assembles next."""
    stages.fetched(
        len(reply.data), reply.latency_ns, reply.first_byte_ns, reply.retries, reply.throttled
    )
    return reply.data


def open_sample(path: str, source: str) -> Image.Image:
    """The decoded RGB image of one record: CelebA cropped to 128x128, DigiFace RGBA -> RGB.

    The file is read whole, then decoded from memory: one read where PIL's file reads would be
    several. (Loaders time the two apart: loaders/decoding.py.)
    """
    return decode_sample(read_file(path), source, path)


def decode_sample(data: bytes, source: str, name: str = "<bytes>") -> Image.Image:
    """The same from a file's bytes (as read from a tar shard); `name` is used in errors."""
    try:
        with Image.open(io.BytesIO(data)) as image:  # reads the header only
            check_size(*image.size, name)
            sample = as_sample(image, source)
    except _DECODE_ERRORS as error:
        raise bad_image(name, error) from None
    return sample
