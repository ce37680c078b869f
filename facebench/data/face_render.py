"""Painting a synthetic face into pixels: a cartoon face (smooth gradient background, shoulders
and neck, skin-toned ellipse head, hair, eye, brow, nose and mouth blobs) plus fine per-pixel
noise, from the numbers facebench/data/face_draws.py draws.

It lives apart from the draws and the encoders because it is the hot loop of generating a set:
numpy in place, in float32, in scratch arrays each thread keeps per image size, on separate
colour planes. None of that may change a pixel: the planes' values are part of the generator's
contract (tests/test_synthetic_images.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from facebench.data.face_draws import Identity, Shot, draw_identity, draw_shot, keyed_rng

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


def _frame(w: _Work, ident: Identity, shot: Shot, width: int, height: int) -> _Frame:
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


def _head_mattes(w: _Work, f: _Frame, ident: Identity) -> None:
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


def _shading(w: _Work, shot: Shot) -> None:
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


def _background_and_body(w: _Work, f: _Frame, ident: Identity, shot: Shot) -> np.ndarray:
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


def _face(w: _Work, rgb: np.ndarray, f: _Frame, ident: Identity, shot: Shot) -> None:
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


def render_face(
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
    ident = draw_identity(keyed_rng(seed, kind, identity))
    img_rng = keyed_rng(seed, kind, identity, image_index)
    shot = draw_shot(img_rng, face_scale, face_dy, noise)
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
