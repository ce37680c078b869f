"""Synthetic stand-ins for CelebA (aligned JPEG) and DigiFace1M (RGBA PNG) face images.

The benchmark measures data loading, so what matters is that a file costs what a real one
costs to read and decode: the same pixel size, mode and codec settings and, above all, about
the same number of encoded bytes. Each image is a cartoon face (smooth gradient background,
skin-toned ellipse head, hair, eye, brow, nose and mouth blobs) plus fine per-pixel noise.
The smooth parts cost the codecs almost nothing; the noise is what sets the byte count, and
its amplitude was tuned so that average sizes match the real datasets. The amplitude varies
per image so that sizes spread as they do in real data.

Face shape and colours depend only on (seed, identity); pose, lighting, background,
expression and noise depend on the image index too. Images of one identity therefore look
alike and a model could in principle learn the identities. Every function here is a pure
function of its integer arguments.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass

import numpy as np
from PIL import Image

__all__ = ["CELEBA_SIZE", "DIGIFACE_SIZE", "celeba_like_jpeg", "digiface_like_png"]

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
_NOISE_SPREAD = 0.3  # sigma of the log-normal per-image amplitude factor

_SKIN_DARK = np.array([85.0, 55.0, 38.0])
_SKIN_LIGHT = np.array([240.0, 200.0, 175.0])

# Fresh arrays of a few hundred KB come from mmap or a trimmed heap and page-fault on
# first touch, which made rendering about four times slower; so each thread reuses its
# own scratch arrays.
_scratch = threading.local()


class _Work:
    """Preallocated float32 scratch arrays and coordinate vectors for one image size."""

    def __init__(self, width: int, height: int) -> None:
        half = min(width, height) / 2.0
        # Pixel-centre coordinates in units of half the shorter side, origin at the centre.
        self.x = ((np.arange(width, dtype=np.float32) + 0.5) - width / 2.0) / half
        self.y = ((np.arange(height, dtype=np.float32) + 0.5) - height / 2.0) / half
        plane = (height, width)
        self.u, self.v, self.r2, self.head, self.hair, self.skin, self.shade, self.t1, self.t2 = (
            np.empty(plane, np.float32) for _ in range(9)
        )
        self.rgb, self.face, self.t3 = (np.empty((3, *plane), np.float32) for _ in range(3))


def _work(width: int, height: int) -> _Work:
    cache: dict[tuple[int, int], _Work] | None = getattr(_scratch, "cache", None)
    if cache is None:
        cache = _scratch.cache = {}
    work = cache.get((width, height))
    if work is None:
        work = cache[(width, height)] = _Work(width, height)
    return work


def _rng(*key: int) -> np.random.Generator:
    if any(k < 0 for k in key):
        raise ValueError(f"identity, image_index and seed must be non-negative, got {key}")
    return np.random.default_rng(np.random.SeedSequence(list(key)))


def _col(c: np.ndarray) -> np.ndarray:
    """A colour as float32 (3, 1, 1), to broadcast over planes without float64 promotion."""
    return np.asarray(c, dtype=np.float32).reshape(3, 1, 1)


def _blob(w: _Work, out: np.ndarray, cx: float, cy: float, sx: float, sy: float) -> np.ndarray:
    # Axis-aligned Gaussians are separable, so an outer product replaces a 2-D exp. Tails
    # are cut at exp(-20): float32 denormals would make all later arithmetic crawl.
    gx = np.exp(np.maximum(-0.5 * ((w.x - cx) / sx) ** 2, -20.0))
    gy = np.exp(np.maximum(-0.5 * ((w.y - cy) / sy) ** 2, -20.0))
    return np.multiply(gy[:, None], gx[None, :], out=out)


def _blend(w: _Work, dst: np.ndarray, weight: np.ndarray, target: np.ndarray) -> None:
    """dst += weight * (target - dst), in place; target is (3, 1, 1) or (3, h, w)."""
    np.subtract(target, dst, out=w.t3)
    w.t3 *= weight
    dst += w.t3


@dataclass(frozen=True)
class _Identity:
    """What stays the same across one identity's images: colours and proportions. Feature
    positions are in head-frame units (u, v): the head ellipse is the unit circle, v grows down."""

    skin: np.ndarray
    hair: np.ndarray
    lips: np.ndarray
    eye_col: np.ndarray
    rx: float
    ry: float
    eye_u: float
    eye_v: float
    eye_s: float
    mouth_v: float
    mouth_w: float
    hairline: float
    hair_up: float
    hair_wide: float


def _identity(rng: np.random.Generator) -> _Identity:
    skin = _SKIN_DARK + rng.uniform(0.0, 1.0) * (_SKIN_LIGHT - _SKIN_DARK)
    skin = skin + rng.normal(0.0, 6.0, 3)
    hair = rng.uniform(10.0, 90.0) * np.array([1.0, 0.8, 0.6]) + rng.normal(0.0, 8.0, 3)
    if rng.uniform() < 0.2:  # some blond or grey hair
        hair = hair + rng.uniform(60.0, 140.0)
    lips = skin * np.array([0.85, 0.55, 0.55]) + rng.normal(0.0, 5.0, 3)
    eye_col = rng.uniform(15.0, 70.0) * np.array([1.0, 0.9, 0.8])
    rx = float(rng.uniform(0.50, 0.60))
    ry = rx * float(rng.uniform(1.22, 1.40))
    # The draws' order is the generator's contract: every set generated so far depends on it.
    draws = [float(rng.uniform(low, high)) for low, high in _FEATURE_RANGES]
    return _Identity(skin, hair, lips, eye_col, rx, ry, *draws)


# eye_u, eye_v, eye_s, mouth_v, mouth_w, hairline, hair_up, hair_wide, drawn in this order.
_FEATURE_RANGES = (
    (0.36, 0.46),
    (-0.12, 0.02),
    (0.07, 0.10),
    (0.50, 0.62),
    (0.22, 0.34),
    (0.40, 0.62),
    (0.06, 0.22),
    (1.04, 1.22),
)


@dataclass(frozen=True)
class _Shot:
    """One image of an identity: pose, lighting, background, clothing, expression, noise."""

    scale: float
    cx: float
    cy: float
    roll: float
    yaw: float
    lx: float
    ly: float
    exposure: float
    light: float
    bg0: np.ndarray
    bg1: np.ndarray
    gx: float
    gy: float
    cloth: np.ndarray
    mouth_open: float
    amp: float


def _shot(rng: np.random.Generator, face_scale: float, face_dy: float, noise: float) -> _Shot:
    scale = face_scale * float(rng.uniform(0.93, 1.07))
    cx = float(rng.normal(0.0, 0.04))
    cy = face_dy + float(rng.normal(0.0, 0.03))
    roll = float(rng.normal(0.0, 0.08))
    yaw = float(np.clip(rng.normal(0.0, 0.15), -0.35, 0.35))
    lx, ly = (float(a) for a in rng.normal(0.0, 1.0, 2))
    exposure = float(rng.uniform(0.8, 1.12))
    light = exposure * float(rng.uniform(0.1, 0.35)) / (float(np.hypot(lx, ly)) + 1e-6)
    # Muted backgrounds: a grey level with a mild tint, graded towards a second colour.
    bg0 = np.clip(rng.uniform(25.0, 230.0) + rng.normal(0.0, 22.0, 3), 0.0, 255.0)
    bg1 = np.clip(bg0 + rng.normal(0.0, 40.0, 3), 0.0, 255.0)
    gx, gy = (0.35 * float(a) for a in rng.normal(0.0, 1.0, 2))
    cloth = np.clip(rng.uniform(15.0, 220.0) + rng.normal(0.0, 35.0, 3), 0.0, 255.0)
    mouth_open = float(rng.uniform(0.0, 1.0))
    amp = noise * float(rng.lognormal(0.0, _NOISE_SPREAD))
    return _Shot(
        scale, cx, cy, roll, yaw, lx, ly, exposure, light, bg0, bg1, gx, gy, cloth, mouth_open, amp
    )


@dataclass(frozen=True)
class _Frame:
    """The head's place in the image: centre, radii, roll, and the edge softness k."""

    cx: float
    cy: float
    rx: float
    ry: float
    c: float
    s: float
    dx: np.ndarray
    dy: np.ndarray
    k: float

    def at(self, u: float, v: float) -> tuple[float, float]:
        """Image coordinates of head-frame point (u, v)."""
        return (
            self.cx + u * self.rx * self.c - v * self.ry * self.s,
            self.cy + u * self.rx * self.s + v * self.ry * self.c,
        )


def _frame(w: _Work, ident: _Identity, shot: _Shot, width: int, height: int) -> _Frame:
    rx, ry = ident.rx * shot.scale, ident.ry * shot.scale
    return _Frame(
        cx=shot.cx,
        cy=shot.cy,
        rx=rx,
        ry=ry,
        c=float(np.cos(shot.roll)),
        s=float(np.sin(shot.roll)),
        dx=w.x - np.float32(shot.cx),
        dy=w.y - np.float32(shot.cy),
        # Soft edges about two pixels wide, so the codecs see antialiased contours.
        k=min(width, height) * rx / 8.0,
    )


def _head_mattes(w: _Work, f: _Frame, ident: _Identity) -> None:
    """Head-frame coordinates of every pixel (rotated by roll), then head, hair, skin mattes."""
    t1, t2 = w.t1, w.t2
    np.multiply(f.dx[None, :], f.c / f.rx, out=w.u)
    w.u += f.dy[:, None] * (f.s / f.rx)
    np.multiply(f.dy[:, None], f.c / f.ry, out=w.v)
    w.v -= f.dx[None, :] * (f.s / f.ry)
    np.multiply(w.u, w.u, out=w.r2)
    np.multiply(w.v, w.v, out=t1)
    w.r2 += t1
    np.subtract(1.0, w.r2, out=w.head)
    w.head *= f.k
    np.clip(w.head, 0.0, 1.0, out=w.head)
    np.multiply(w.u, 1.0 / ident.hair_wide, out=t1)
    t1 *= t1
    np.add(w.v, ident.hair_up, out=t2)
    t2 *= t2
    t1 += t2
    np.subtract(1.0, t1, out=w.hair)
    w.hair *= f.k
    np.clip(w.hair, 0.0, 1.0, out=w.hair)
    # Hair frames the upper head only; the skin (head below the hairline) is drawn over it.
    np.subtract(0.3, w.v, out=t1)
    t1 *= 2.0
    np.clip(t1, 0.0, 1.0, out=t1)
    w.hair *= t1
    np.add(w.v, ident.hairline, out=t1)
    t1 *= 8.0
    np.clip(t1, 0.0, 1.0, out=t1)
    np.multiply(w.head, t1, out=w.skin)


def _shading(w: _Work, shot: _Shot) -> None:
    """Lambert-like shading, the surface normal approximated by the head coordinates, darkened
    towards the rim."""
    t1 = w.t1
    np.multiply(w.u, shot.light * shot.lx, out=w.shade)
    np.multiply(w.v, shot.light * shot.ly, out=t1)
    w.shade += t1
    w.shade += shot.exposure
    np.subtract(w.r2, 0.6, out=t1)
    np.maximum(t1, 0.0, out=t1)
    t1 *= 0.25
    w.shade -= t1


def _background_and_body(w: _Work, f: _Frame, ident: _Identity, shot: _Shot) -> np.ndarray:
    """A linear gradient between two colours, shoulders (an ellipse below the head) and a neck
    (a soft vertical band; separable)."""
    t1, t2, rgb = w.t1, w.t2, w.rgb
    np.multiply(w.x[None, :], shot.gx, out=t1)
    t1 += shot.gy * w.y[:, None]
    t1 += 0.5
    np.clip(t1, 0.0, 1.0, out=t1)
    np.multiply(t1, _col(shot.bg1 - shot.bg0), out=rgb)
    rgb += _col(shot.bg0)
    np.multiply(f.dx[None, :], 1.0 / (2.3 * f.rx), out=t1)
    t1 *= t1
    np.multiply(f.dy[:, None] - 2.15 * f.ry, 1.0 / (1.0 * f.ry), out=t2)
    t2 *= t2
    t1 += t2
    np.subtract(1.0, t1, out=t1)
    t1 *= f.k
    np.clip(t1, 0.0, 1.0, out=t1)
    _blend(w, rgb, t1, _col(shot.cloth * shot.exposure))
    band = np.clip((0.5 * f.rx - np.abs(f.dx)) * (f.k / f.rx), 0.0, 1.0)
    below = np.clip((f.dy - 0.5 * f.ry) * (f.k / f.ry), 0.0, 1.0)
    np.multiply(below[:, None], band[None, :], out=t1)
    _blend(w, rgb, t1, _col(ident.skin * (0.8 * shot.exposure)))
    return rgb


def _face(w: _Work, rgb: np.ndarray, f: _Frame, ident: _Identity, shot: _Shot) -> None:
    """Hair, then the face: axis-aligned blobs placed in the head frame; yaw slides them."""
    t1, t2, face = w.t1, w.t2, w.face
    np.multiply(w.shade, _col(ident.hair), out=face)
    _blend(w, rgb, w.hair, face)
    np.multiply(w.shade, _col(ident.skin), out=face)
    es = ident.eye_s * f.rx
    nx, ny = f.at(shot.yaw * 0.5, 0.28)
    _blob(w, t1, nx, ny, 0.09 * f.rx, 0.2 * f.ry)
    t1 *= -0.12
    t1 += 1.0
    face *= t1
    elx, ely = f.at(shot.yaw * 0.4 - ident.eye_u, ident.eye_v)
    erx, ery = f.at(shot.yaw * 0.4 + ident.eye_u, ident.eye_v)
    _blob(w, t1, elx, ely, es * 1.5, es)
    t1 += _blob(w, t2, erx, ery, es * 1.5, es)
    t1 *= 0.9
    _blend(w, face, t1, _col(ident.eye_col))
    _blob(w, t1, elx, ely - 2.4 * es, es * 2.2, es * 0.4)
    t1 += _blob(w, t2, erx, ery - 2.4 * es, es * 2.2, es * 0.4)
    t1 *= 0.7
    _blend(w, face, t1, _col(ident.hair))
    mx, my = f.at(shot.yaw * 0.4, ident.mouth_v)
    _blob(w, t1, mx, my, ident.mouth_w * f.rx, 0.04 * f.ry * (1.0 + shot.mouth_open))
    t1 *= 0.8
    _blend(w, face, t1, _col(ident.lips * shot.exposure))
    _blend(w, rgb, w.skin, face)


def _render_face(
    size: tuple[int, int],
    kind: int,
    identity: int,
    image_index: int,
    seed: int,
    face_scale: float,
    face_dy: float,
    noise: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Return planar uint8 RGB of shape (3, h, w) and a uint8 (h, w) head-and-hair matte.

    Planes are kept separate because per-channel broadcasting over an interleaved
    (h, w, 3) array is several times slower in numpy; PIL merges the planes.
    """
    width, height = size
    w = _work(width, height)
    ident = _identity(_rng(seed, kind, identity))
    img_rng = _rng(seed, kind, identity, image_index)
    shot = _shot(img_rng, face_scale, face_dy, noise)
    frame = _frame(w, ident, shot, width, height)
    _head_mattes(w, frame, ident)
    _shading(w, shot)
    rgb = _background_and_body(w, frame, ident, shot)
    _face(w, rgb, frame, ident, shot)
    # Fine noise, the same in all channels (luminance, as photo detail mostly is; JPEG's
    # 4:2:0 would discard most chroma detail anyway). Uniform draws are several times
    # cheaper than normals and cost the codecs about the same; amp is the noise std.
    t1 = w.t1
    img_rng.random(out=t1, dtype=np.float32)
    t1 -= 0.5
    t1 *= shot.amp * 12.0**0.5
    rgb += t1
    np.clip(rgb, 0.0, 255.0, out=rgb)
    np.maximum(w.head, w.hair, out=t1)
    t1 *= 255.0
    t1 += 0.5
    return rgb.astype(np.uint8), t1.astype(np.uint8)


def celeba_like_jpeg(identity: int, image_index: int, seed: int) -> bytes:
    """A 178x218 RGB baseline JPEG (4:2:0) resembling an aligned CelebA face."""
    planes, _ = _render_face(
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
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=_CELEBA_JPEG_QUALITY)
    return buf.getvalue()


def digiface_like_png(identity: int, image_index: int, seed: int) -> bytes:
    """A 112x112 RGBA PNG resembling a DigiFace1M render; alpha is the head-and-hair matte.

    The colour planes are filled everywhere, so ``convert("RGB")`` (which drops alpha)
    still yields a complete picture, as loaders of the real dataset expect.
    """
    planes, matte = _render_face(
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
    buf = io.BytesIO()
    # zlib level 1: level 6 (PIL's default) costs 3-4x the encode time on these noisy
    # planes for about 10% fewer bytes, and inflate speed is the same either way.
    img.save(buf, format="PNG", compress_level=_DIGIFACE_PNG_LEVEL)
    return buf.getvalue()


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
    pick = _rng(seed, _FOLDER_KIND, image_index, 0)  # independent of the class: any class, any mix
    size = FOLDER_SIZES[int(pick.integers(len(FOLDER_SIZES)))]
    extension, mode, fmt, options = FOLDER_VARIANTS[int(pick.integers(len(FOLDER_VARIANTS)))]
    planes, matte = _render_face(
        size, _FOLDER_KIND, identity, image_index, seed, face_scale=1.0, face_dy=0.0, noise=2.0
    )
    image = Image.merge("RGB", [Image.fromarray(p) for p in planes])
    if mode == "RGBA":
        image.putalpha(Image.fromarray(matte))
    elif mode == "P":
        image = image.quantize(colors=64)
    elif mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue(), extension
