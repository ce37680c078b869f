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
    ident = _rng(seed, kind, identity)
    img_rng = _rng(seed, kind, identity, image_index)

    # Identity: colours and proportions. Feature positions are in head-frame units
    # (u, v), where the head ellipse is the unit circle and v grows downwards.
    skin = _SKIN_DARK + ident.uniform(0.0, 1.0) * (_SKIN_LIGHT - _SKIN_DARK)
    skin = skin + ident.normal(0.0, 6.0, 3)
    hair = ident.uniform(10.0, 90.0) * np.array([1.0, 0.8, 0.6]) + ident.normal(0.0, 8.0, 3)
    if ident.uniform() < 0.2:  # some blond or grey hair
        hair = hair + ident.uniform(60.0, 140.0)
    lips = skin * np.array([0.85, 0.55, 0.55]) + ident.normal(0.0, 5.0, 3)
    eye_col = ident.uniform(15.0, 70.0) * np.array([1.0, 0.9, 0.8])
    rx = float(ident.uniform(0.50, 0.60))
    ry = rx * float(ident.uniform(1.22, 1.40))
    eye_u = float(ident.uniform(0.36, 0.46))
    eye_v = float(ident.uniform(-0.12, 0.02))
    eye_s = float(ident.uniform(0.07, 0.10))
    mouth_v = float(ident.uniform(0.50, 0.62))
    mouth_w = float(ident.uniform(0.22, 0.34))
    hairline = float(ident.uniform(0.40, 0.62))
    hair_up = float(ident.uniform(0.06, 0.22))
    hair_wide = float(ident.uniform(1.04, 1.22))

    # Image: pose, lighting, background, clothing, expression, noise level.
    scale = face_scale * float(img_rng.uniform(0.93, 1.07))
    cx = float(img_rng.normal(0.0, 0.04))
    cy = face_dy + float(img_rng.normal(0.0, 0.03))
    roll = float(img_rng.normal(0.0, 0.08))
    yaw = float(np.clip(img_rng.normal(0.0, 0.15), -0.35, 0.35))
    lx, ly = (float(a) for a in img_rng.normal(0.0, 1.0, 2))
    exposure = float(img_rng.uniform(0.8, 1.12))
    light = exposure * float(img_rng.uniform(0.1, 0.35)) / (float(np.hypot(lx, ly)) + 1e-6)
    # Muted backgrounds: a grey level with a mild tint, graded towards a second colour.
    bg0 = np.clip(img_rng.uniform(25.0, 230.0) + img_rng.normal(0.0, 22.0, 3), 0.0, 255.0)
    bg1 = np.clip(bg0 + img_rng.normal(0.0, 40.0, 3), 0.0, 255.0)
    gx, gy = (0.35 * float(a) for a in img_rng.normal(0.0, 1.0, 2))
    cloth = np.clip(img_rng.uniform(15.0, 220.0) + img_rng.normal(0.0, 35.0, 3), 0.0, 255.0)
    mouth_open = float(img_rng.uniform(0.0, 1.0))
    amp = noise * float(img_rng.lognormal(0.0, _NOISE_SPREAD))

    x, y = w.x, w.y
    t1, t2 = w.t1, w.t2
    rx, ry = rx * scale, ry * scale
    dx = x - np.float32(cx)
    dy = y - np.float32(cy)
    c, s = float(np.cos(roll)), float(np.sin(roll))

    def at(u: float, v: float) -> tuple[float, float]:
        """Image coordinates of head-frame point (u, v)."""
        return cx + u * rx * c - v * ry * s, cy + u * rx * s + v * ry * c

    # Head-frame coordinates of every pixel (rotated by roll).
    np.multiply(dx[None, :], c / rx, out=w.u)
    w.u += dy[:, None] * (s / rx)
    np.multiply(dy[:, None], c / ry, out=w.v)
    w.v -= dx[None, :] * (s / ry)
    np.multiply(w.u, w.u, out=w.r2)
    np.multiply(w.v, w.v, out=t1)
    w.r2 += t1

    # Soft edges about two pixels wide, so the codecs see antialiased contours.
    k = min(width, height) * rx / 8.0
    np.subtract(1.0, w.r2, out=w.head)
    w.head *= k
    np.clip(w.head, 0.0, 1.0, out=w.head)
    np.multiply(w.u, 1.0 / hair_wide, out=t1)
    t1 *= t1
    np.add(w.v, hair_up, out=t2)
    t2 *= t2
    t1 += t2
    np.subtract(1.0, t1, out=w.hair)
    w.hair *= k
    np.clip(w.hair, 0.0, 1.0, out=w.hair)
    # Hair frames the upper head only; the skin (head below the hairline) is drawn over it.
    np.subtract(0.3, w.v, out=t1)
    t1 *= 2.0
    np.clip(t1, 0.0, 1.0, out=t1)
    w.hair *= t1
    np.add(w.v, hairline, out=t1)
    t1 *= 8.0
    np.clip(t1, 0.0, 1.0, out=t1)
    np.multiply(w.head, t1, out=w.skin)

    # Lambert-like shading with the surface normal approximated by the head coordinates,
    # darkened towards the rim.
    np.multiply(w.u, light * lx, out=w.shade)
    np.multiply(w.v, light * ly, out=t1)
    w.shade += t1
    w.shade += exposure
    np.subtract(w.r2, 0.6, out=t1)
    np.maximum(t1, 0.0, out=t1)
    t1 *= 0.25
    w.shade -= t1

    # Background: linear gradient between two colours.
    np.multiply(x[None, :], gx, out=t1)
    t1 += gy * y[:, None]
    t1 += 0.5
    np.clip(t1, 0.0, 1.0, out=t1)
    rgb = w.rgb
    np.multiply(t1, _col(bg1 - bg0), out=rgb)
    rgb += _col(bg0)

    # Shoulders (an ellipse below the head) and a neck (a soft vertical band; separable).
    np.multiply(dx[None, :], 1.0 / (2.3 * rx), out=t1)
    t1 *= t1
    np.multiply(dy[:, None] - 2.15 * ry, 1.0 / (1.0 * ry), out=t2)
    t2 *= t2
    t1 += t2
    np.subtract(1.0, t1, out=t1)
    t1 *= k
    np.clip(t1, 0.0, 1.0, out=t1)
    _blend(w, rgb, t1, _col(cloth * exposure))
    band = np.clip((0.5 * rx - np.abs(dx)) * (k / rx), 0.0, 1.0)
    below = np.clip((dy - 0.5 * ry) * (k / ry), 0.0, 1.0)
    np.multiply(below[:, None], band[None, :], out=t1)
    _blend(w, rgb, t1, _col(skin * (0.8 * exposure)))

    np.multiply(w.shade, _col(hair), out=w.face)
    _blend(w, rgb, w.hair, w.face)

    # Features are axis-aligned blobs placed in the head frame; yaw slides them sideways.
    face = w.face
    np.multiply(w.shade, _col(skin), out=face)
    es = eye_s * rx
    nx, ny = at(yaw * 0.5, 0.28)
    _blob(w, t1, nx, ny, 0.09 * rx, 0.2 * ry)
    t1 *= -0.12
    t1 += 1.0
    face *= t1
    elx, ely = at(yaw * 0.4 - eye_u, eye_v)
    erx, ery = at(yaw * 0.4 + eye_u, eye_v)
    _blob(w, t1, elx, ely, es * 1.5, es)
    t1 += _blob(w, t2, erx, ery, es * 1.5, es)
    t1 *= 0.9
    _blend(w, face, t1, _col(eye_col))
    _blob(w, t1, elx, ely - 2.4 * es, es * 2.2, es * 0.4)
    t1 += _blob(w, t2, erx, ery - 2.4 * es, es * 2.2, es * 0.4)
    t1 *= 0.7
    _blend(w, face, t1, _col(hair))
    mx, my = at(yaw * 0.4, mouth_v)
    _blob(w, t1, mx, my, mouth_w * rx, 0.04 * ry * (1.0 + mouth_open))
    t1 *= 0.8
    _blend(w, face, t1, _col(lips * exposure))
    _blend(w, rgb, w.skin, face)

    # Fine noise, the same in all channels (luminance, as photo detail mostly is; JPEG's
    # 4:2:0 would discard most chroma detail anyway). Uniform draws are several times
    # cheaper than normals and cost the codecs about the same; amp is the noise std.
    img_rng.random(out=t1, dtype=np.float32)
    t1 -= 0.5
    t1 *= amp * 12.0**0.5
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
