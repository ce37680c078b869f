"""decoder=fast: libspng for PNGs and libjpeg-turbo for JPEGs, called directly, with PIL's pixels.

    PNG, 8 bits per sample (grey, grey+alpha, RGB, RGBA, palette)  -> pyspng-seunglab (libspng)
    JPEG, grey or YCbCr/RGB                                        -> simplejpeg (libjpeg-turbo)
    anything else, and any file either refuses                     -> PIL, counted as a fallback

Why these two: both come from the package index as wheels with their C library inside (no system
library to install), and both take bytes and return a numpy array. Measured on the synthetic set
(one core): pyspng-seunglab 1.1.3 decodes its PNGs at 2.0x PIL's rate, the older pyspng 0.1.4 at
1.3x; simplejpeg decodes its JPEGs at 2.2x PIL's. PyTurboJPEG would need libjpeg-turbo 3 installed
on the system (Debian 12 has 2.1). simplejpeg releases the GIL while it decodes; neither pyspng
does, so threads (loader=spdl, nodes' thread workers) decode PNGs one at a time.
bench/limits.py measures each decoder's limit beside PIL's.

Identical pixels, and why: libspng and PIL's zlib-based reader produce the same 8-bit samples, and
both turn grey into RGB by repeating it and drop alpha without blending; palette entries are the
palette's colours in both. Other bit depths convert differently (PIL clips 16-bit grey, say), so
they go to PIL. A JPEG decoded by the same libjpeg-turbo with the same IDCT (islow) and the same
(fancy) upsampling gives the same samples as PIL, which uses exactly those; CMYK and YCCK JPEGs
convert to RGB in PIL's own way, so they go to PIL. Strict decoding: a file libjpeg-turbo or
libspng only warns about (truncated, a chunk's checksum wrong) goes to PIL, which then decodes it as
`loader=dataset` does, or raises the same error; tests/test_fast_codecs.py checks every case
sample by sample.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyspng
import simplejpeg
import torch

from facebench import stages
from facebench.data.fast_decode import (
    PNG_SIGNATURE,
    celeba_cropped,
    jpeg_header,
    pil_rgb,
    png_header,
)
from facebench.data.images import bad_image, check_size

# IHDR colour types libspng turns into PIL's RGB: grey, RGB, palette, grey+alpha, RGBA.
_PNG_COLOUR_TYPES = frozenset({0, 2, 3, 4, 6})


def png_intact(data: bytes) -> bool:
    """Whether every chunk of a PNG is whole and its checksum right. libspng decodes some files
    whose checksums are wrong, where PIL refuses them (a damaged IHDR): such files go to PIL,
    which decides. CRC-32 runs at gigabytes a second; a face's PNG has a handful of chunks."""
    at = len(PNG_SIGNATURE)
    while at + 12 <= len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        end = at + 8 + length
        if end + 4 > len(data):
            return False
        if zlib.crc32(data[at + 4 : end]) != int.from_bytes(data[end : end + 4], "big"):
            return False
        if data[at + 4 : at + 8] == b"IEND":
            return True
        at = end + 4
    return False


def decode_direct(data: bytes, name: str = "<bytes>") -> np.ndarray | None:
    """Encoded bytes -> (H, W, 3) uint8 RGB, decoded by libspng or libjpeg-turbo; None where
    neither would give PIL's pixels (see the module docstring), for PIL to decode instead.
    Refuses, as PIL's path does, an image over data.max_pixels, before anything is decoded."""
    png = png_header(data)
    if png is not None:
        width, height, depth, colour = png
        check_size(width, height, name)
        if depth != 8 or colour not in _PNG_COLOUR_TYPES or not png_intact(data):
            return None
        try:
            return pyspng.load(data, format="RGB")
        except Exception:  # libspng's errors are plain exceptions; PIL decides
            return None
    jpeg = jpeg_header(data)
    if jpeg is not None and jpeg[0] in (1, 3):
        check_size(jpeg[1], jpeg[2], name)
        try:
            return simplejpeg.decode_jpeg(
                data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True
            )
        except ValueError:  # corrupt or truncated (strict): PIL decodes it or says why not
            return None
    return None


def decode_rgb(data: bytes, source: str, name: str = "<bytes>") -> torch.Tensor:
    """Encoded image bytes -> (3, H, W) uint8 RGB, CelebA cropped to its box: pixel for pixel
    PIL's; files the direct decoders cannot take are decoded by PIL and counted
    (stages.fallback: the run's `decode_fallbacks`)."""
    if not data:
        raise bad_image(name, ValueError("empty file"))
    rgb = decode_direct(data, name)
    if rgb is not None:
        return celeba_cropped(torch.from_numpy(rgb).permute(2, 0, 1), source)
    stages.fallback()
    return pil_rgb(data, source, name)
