"""Synthetic stand-ins for CelebA (aligned JPEG) and DigiFace1M (RGBA PNG) face images, and the
mixed images of a class-folder set: the sizes, modes and codec settings, encoded.

The benchmark measures data loading, so what matters is that a file costs what a real one
costs to read and decode: the same pixel size, mode and codec settings and, above all, about
the same number of encoded bytes. Each image is a cartoon face (facebench/data/face_render.py)
plus fine per-pixel noise. The smooth parts cost the codecs almost nothing; the noise is what
sets the byte count, and its amplitude was tuned here so that average sizes match the real
datasets. The amplitude varies per image (facebench/data/face_draws.py) so that sizes spread as
they do in real data. Every function here is a pure function of its integer arguments.
"""

from __future__ import annotations

import io

from PIL import Image

from facebench.data.face_draws import keyed_rng
from facebench.data.face_render import render_face

__all__ = [
    "CELEBA_SIZE",
    "DIGIFACE_SIZE",
    "FOLDER_SIZES",
    "FOLDER_VARIANTS",
    "celeba_like_jpeg",
    "digiface_like_png",
    "folder_image",
]

CELEBA_SIZE: tuple[int, int] = (178, 218)  # (width, height)
DIGIFACE_SIZE: tuple[int, int] = (112, 112)

_CELEBA_KIND = 1
_DIGIFACE_KIND = 2

# Tuned so that mean encoded sizes match the real datasets: CelebA aligned JPEGs average
# about 6.9 KB, DigiFace1M PNGs about 20 KB. Amplitudes are noise standard deviations in
# 8-bit levels before the per-image log-normal factor.
_CELEBA_JPEG_QUALITY = 85
_CELEBA_NOISE = 3.6
_DIGIFACE_PNG_LEVEL = 1
_DIGIFACE_NOISE = 1.1


def celeba_like_jpeg(identity: int, image_index: int, seed: int) -> bytes:
    """A 178x218 RGB baseline JPEG (4:2:0) resembling an aligned CelebA face."""
    planes, _ = render_face(
        CELEBA_SIZE,
        _CELEBA_KIND,
        identity,
        image_index,
        seed,
        face_scale=0.88,
        face_dy=-0.02,
        noise=_CELEBA_NOISE,
    )
    img = Image.merge("RGB", [Image.fromarray(p) for p in planes])
    return _encoded(img, "JPEG", quality=_CELEBA_JPEG_QUALITY)


def digiface_like_png(identity: int, image_index: int, seed: int) -> bytes:
    """A 112x112 RGBA PNG resembling a DigiFace1M render; alpha is the head-and-hair matte.

    The colour planes are filled everywhere, so ``convert("RGB")`` (which drops alpha)
    still yields a complete picture, as loaders of the real dataset expect.
    """
    planes, matte = render_face(
        DIGIFACE_SIZE,
        _DIGIFACE_KIND,
        identity,
        image_index,
        seed,
        face_scale=1.25,
        face_dy=0.0,
        noise=_DIGIFACE_NOISE,
    )
    img = Image.merge("RGBA", [Image.fromarray(p) for p in (*planes, matte)])
    # zlib level 1: level 6 (PIL's default) costs 3-4x the encode time on these noisy
    # planes for about 10% fewer bytes, and inflate speed is the same either way.
    return _encoded(img, "PNG", compress_level=_DIGIFACE_PNG_LEVEL)


_FOLDER_KIND = 3
# A bounded set of sizes, wide, tall and square (the renderer keeps scratch buffers per size).
FOLDER_SIZES: tuple[tuple[int, int], ...] = (
    (64, 64),
    (96, 128),
    (128, 96),
    (160, 120),
    (120, 160),
    (200, 150),
    (150, 200),
    (224, 224),
    (256, 192),
    (80, 240),
    (240, 80),
    (112, 112),
)
# (extension, PIL mode, format, save options): the modes and formats a real folder holds, with
# extensions in mixed case.
FOLDER_VARIANTS: tuple[tuple[str, str, str, dict], ...] = (
    (".jpg", "RGB", "JPEG", {"quality": 90}),
    (".png", "RGBA", "PNG", {"compress_level": 1}),
    (".JPEG", "L", "JPEG", {"quality": 85}),
    (".Png", "P", "PNG", {"compress_level": 1}),
    (".webp", "RGB", "WEBP", {"quality": 80}),
    (".jpeg", "RGB", "JPEG", {"quality": 90, "progressive": True}),
)


def folder_image(identity: int, image_index: int, seed: int) -> tuple[bytes, str]:
    """One image of a class-folder data set: a size, mode and format that vary with the index.
    Returns the encoded bytes and the file extension they belong under."""
    # Keyed by the index alone, not the class: any class holds any mix of sizes and formats.
    pick = keyed_rng(seed, _FOLDER_KIND, image_index, 0)
    size = FOLDER_SIZES[int(pick.integers(len(FOLDER_SIZES)))]
    extension, mode, fmt, options = FOLDER_VARIANTS[int(pick.integers(len(FOLDER_VARIANTS)))]
    planes, matte = render_face(
        size, _FOLDER_KIND, identity, image_index, seed, face_scale=1.0, face_dy=0.0, noise=2.0
    )
    image = Image.merge("RGB", [Image.fromarray(p) for p in planes])
    if mode == "RGBA":
        image.putalpha(Image.fromarray(matte))
    elif mode == "P":
        image = image.quantize(colors=64)
    elif mode != "RGB":
        image = image.convert(mode)
    return _encoded(image, fmt, **options), extension


def _encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    """The file's bytes: `image` saved in format `fmt` with PIL's save `options`."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()
