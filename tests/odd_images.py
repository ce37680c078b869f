"""Images of every kind PIL accepts, in the real layouts: the unusual cases real folders hold.

Images smaller than CelebA's crop box (which PIL pads with black), grey, CMYK, progressive and
EXIF-rotated JPEGs, other formats under a .jpg name, 16-bit, palette-with-transparency,
interlaced, grey-alpha PNGs, and sizes from 1x1 up.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import png  # pypng: PIL cannot write interlaced or 16-bit RGB PNGs
from PIL import Image


def _pixels(height: int, width: int, channels: int, seed: int, top: int = 256) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Smooth gradients plus noise, so that resampling differences stay small but real.
    ramp = np.linspace(0, top - 1, width)[None, :, None] * np.ones((height, 1, channels))
    noise = rng.integers(0, top // 8, size=(height, width, channels))
    return (ramp * 0.8 + noise).astype(np.uint16 if top > 256 else np.uint8)


def _encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _rgb(size: tuple[int, int], seed: int) -> Image.Image:
    return Image.fromarray(_pixels(size[1], size[0], 3, seed))


def _pypng(rows: np.ndarray, greyscale: bool, alpha: bool, bitdepth: int, interlace: bool) -> bytes:
    height, width = rows.shape[:2]
    writer = png.Writer(
        width,
        height,
        greyscale=greyscale,
        alpha=alpha,
        bitdepth=bitdepth,
        interlace=interlace,
    )
    buffer = io.BytesIO()
    writer.write(buffer, rows.reshape(height, -1).tolist())
    return buffer.getvalue()


def celeba_variants() -> list[bytes]:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 (neither PIL nor torchvision applies it)
    palette = _rgb((178, 218), 9).convert("P")
    return [
        _encode(_rgb((1, 1), 1), "JPEG"),
        _encode(_rgb((100, 120), 2), "JPEG"),  # smaller than the crop box
        _encode(_rgb((130, 130), 3), "JPEG"),
        _encode(_rgb((178, 218), 4).convert("L"), "JPEG"),
        _encode(_rgb((178, 218), 5).convert("CMYK"), "JPEG"),
        _encode(_rgb((178, 218), 6), "JPEG", progressive=True),
        _encode(_rgb((400, 500), 7), "JPEG", quality=95),
        _encode(_rgb((178, 218), 8), "JPEG", exif=exif),
        _encode(palette, "PNG"),  # a PNG under a .jpg name
        _encode(_rgb((178, 218), 10), "WEBP", lossless=True),
        _encode(_rgb((178, 218), 11).convert("RGBA"), "BMP"),
    ]


def digiface_variants() -> list[bytes]:
    transparent = _rgb((112, 112), 20).convert("P")
    return [
        _encode(_rgb((112, 112), 21).convert("RGBA"), "PNG"),
        _pypng(_pixels(112, 112, 1, 22, top=65536), True, False, 16, False),  # 16-bit grey
        _pypng(_pixels(112, 112, 3, 23, top=65536), False, False, 16, False),  # 16-bit RGB
        _encode(transparent, "PNG", transparency=0),  # palette with transparency
        _pypng(_pixels(112, 112, 4, 24), False, True, 8, True),  # interlaced RGBA
        _encode(_rgb((112, 112), 25).convert("L"), "PNG"),
        _encode(_rgb((112, 112), 26).convert("LA"), "PNG"),
        _encode(_rgb((64, 80), 27), "PNG"),
        _encode(_rgb((1, 1), 28).convert("RGBA"), "PNG"),
        _encode(_rgb((300, 200), 29), "PNG"),
    ]


def variants_tree(root: Path) -> Path:
    """A CelebA + DigiFace1M tree at root holding every variant, each checked to open in PIL."""
    celeba, digiface = celeba_variants(), digiface_variants()
    images = root / "CelebA" / "img_align_celeba"
    images.mkdir(parents=True)
    names = [f"{index:06d}.jpg" for index in range(1, len(celeba) + 1)]
    for name, data in zip(names, celeba, strict=True):
        (images / name).write_bytes(data)
    labels = "".join(f"{name} {1 + index % 3}\n" for index, name in enumerate(names))
    (root / "CelebA" / "identity_CelebA.txt").write_text(labels)
    folder = root / "DigiFace1M" / "0"
    folder.mkdir(parents=True)
    for number, data in enumerate(digiface):
        (folder / f"{number}.png").write_bytes(data)
    for path in [*images.iterdir(), *folder.iterdir()]:
        with Image.open(path) as image:  # the premise: PIL accepts every one of them
            image.load()
    return root
