"""A faster decode-and-transform with the article's semantics: torchvision.io and uint8 tensors.

Grey and colour (YCbCr) JPEGs decode with torchvision.io (libjpeg-turbo, as PIL uses, without
PIL's per-image overhead). Everything else decodes with PIL, so that every image PIL accepts gives
the same sample here: PNGs (torchvision 0.29's PNG decoder crashes the process on some damaged
files, where PIL raises an error), CMYK and YCCK JPEGs (whose conversion to RGB differs between the
two), any other format, and any JPEG torchvision refuses. Then RGB -> CelebA crop box (the part
outside a small image black, as PIL's crop pads it) -> Resize(112, 112) with antialiasing on a
uint8 tensor -> the batch transforms (random crop, normalize) on the whole batch. Pixels match
PIL's path to within a few grey levels (resampling rounds differently); images already 112x112
are not resampled at all.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional

from facebench.data.images import CELEBA_BOX, bad_image, check_size, decode_sample
from facebench.data.sources import CELEBA
from facebench.data.transforms import RESIZE

# torchvision 0.29 warns on every call that its image codecs are deprecated in favour of
# TorchCodec; they are the ones pinned and tested here, and stay until the pin moves.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision",
    category=DeprecationWarning,
)


# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE_MARKERS = frozenset(range(0xD0, 0xDA)) | {0x01}  # RSTn, SOI, EOI, TEM: no length


def jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """(colour components, width, height) of a JPEG, read from its start-of-frame header; None
    if the bytes are not a JPEG with a readable header. Components: 1 grey, 3 YCbCr/RGB, 4
    CMYK/YCCK."""
    if not data.startswith(b"\xff\xd8"):
        return None
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE_MARKERS:
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF_MARKERS:
            if at + 9 >= len(data):
                return None
            height = int.from_bytes(data[at + 5 : at + 7], "big")
            width = int.from_bytes(data[at + 7 : at + 9], "big")
            return data[at + 9], width, height
        at += 2 + length
    return None


def jpeg_components(data: bytes) -> int | None:
    """The number of colour components of a JPEG (see jpeg_header), or None."""
    header = jpeg_header(data)
    return header[0] if header else None


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_header(data: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, bit depth, colour type) from a PNG's IHDR chunk; None if the bytes are
    not a PNG with a readable header."""
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR" or len(data) < 26:
        return None
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    return width, height, data[24], data[25]


def encoded_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's or PNG's header, without decoding; None for other bytes."""
    header = jpeg_header(data)
    if header is not None:
        return header[1], header[2]
    png = png_header(data)
    return (png[0], png[1]) if png is not None else None


def celeba_cropped(image: torch.Tensor, source: str) -> torch.Tensor:
    """A decoded (3, H, W) image as the article used it: CelebA's cropped to its box."""
    return crop_box(image, CELEBA_BOX) if source == CELEBA else image


def pil_rgb(data: bytes, source: str, name: str = "<bytes>") -> torch.Tensor:
    """Encoded image bytes -> (3, H, W) uint8 RGB decoded by PIL, CelebA cropped: what the
    faster decoders hand over for the files they leave to PIL."""
    rgb = np.asarray(decode_sample(data, source, name))  # RGB, CelebA already cropped
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)


def decode_rgb(data: bytes, source: str, name: str = "<bytes>") -> torch.Tensor:
    """Encoded image bytes -> (3, H, W) uint8 RGB, CelebA cropped to its box, as PIL's path
    gives it (see the module docstring for which decoder takes which file)."""
    if not data:
        raise bad_image(name, ValueError("empty file"))
    header = jpeg_header(data)
    if header is not None and header[0] in (1, 3):
        check_size(header[1], header[2], name)  # before anything is decoded
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # a writable copy
        try:
            image = decode_image(encoded, mode=ImageReadMode.RGB)  # (3, H, W) uint8
        except RuntimeError:
            image = None  # PIL decides: it reads some files libjpeg-turbo's strict mode refuses
        if image is not None:
            return celeba_cropped(image, source)
    return pil_rgb(data, source, name)  # anything else (see the module docstring)


def resized(image: torch.Tensor, size: tuple[int, int] = RESIZE) -> torch.Tensor:
    """(3, H, W) uint8 -> (H, W, 3) resized to `size` with antialiasing (not resampled when it
    has that size already), as the article's Resize((112, 112)) on a uint8 tensor."""
    if tuple(image.shape[1:]) != tuple(size):
        image = functional.resize(image, list(size), antialias=True)
    return image.permute(1, 2, 0).contiguous()


def decode_resized(
    data: bytes, source: str, name: str = "<bytes>", size: tuple[int, int] = RESIZE
) -> torch.Tensor:
    """Encoded image bytes -> (112, 112, 3) uint8 (or `size`), HWC, as the article prepared it."""
    return resized(decode_rgb(data, source, name), size)


def crop_box(image: torch.Tensor, box: tuple[int, int, int, int]) -> torch.Tensor:
    """(C, H, W) -> the (left, top, right, bottom) box, black where the box leaves the image,
    as PIL's Image.crop pads it."""
    left, top, right, bottom = box
    height, width = image.shape[1:]
    if left >= 0 and top >= 0 and right <= width and bottom <= height:
        return image[:, top:bottom, left:right]
    out = image.new_zeros((image.shape[0], bottom - top, right - left))
    x0, y0, x1, y1 = max(left, 0), max(top, 0), min(right, width), min(bottom, height)
    if x1 > x0 and y1 > y0:
        out[:, y0 - top : y1 - top, x0 - left : x1 - left] = image[:, y0:y1, x0:x1]
    return out


def resize_sample(
    image: torch.Tensor, source: str, cropped: bool = False, size: tuple[int, int] = RESIZE
) -> torch.Tensor:
    """(3, H, W) uint8 RGB -> cropped if CelebA (unless already), resized to `size` (112x112),
    as (H, W, 3)."""
    return resized(image if cropped else celeba_cropped(image, source), size)
