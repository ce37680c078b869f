"""What a synthetic face looks like, drawn at random: an identity's colours and proportions, and
one image's pose, lighting, background, clothing, expression and noise.

These are numbers only; facebench/data/face_render.py paints them. They live apart because they
are the generator's contract: face shape and colours depend only on (seed, kind, identity), the
rest on the image index too, so images of one identity look alike and a model could in principle
learn the identities. Every draw is a pure function of its integer key, and the order of the
draws is part of that contract: every set generated so far depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SKIN_DARK = np.array([85.0, 55.0, 38.0])
SKIN_LIGHT = np.array([240.0, 200.0, 175.0])
NOISE_SPREAD = 0.3  # sigma of the log-normal per-image noise amplitude factor

# eye_u, eye_v, eye_s, mouth_v, mouth_w, hairline, hair_up, hair_wide, drawn in this order.
FEATURE_RANGES = (
    (0.36, 0.46),
    (-0.12, 0.02),
    (0.07, 0.10),
    (0.50, 0.62),
    (0.22, 0.34),
    (0.40, 0.62),
    (0.06, 0.22),
    (1.04, 1.22),
)


def keyed_rng(*key: int) -> np.random.Generator:
    """A generator that depends on `key` alone (seed, kind, identity[, image index])."""
    if any(k < 0 for k in key):
        raise ValueError(f"identity, image_index and seed must be non-negative, got {key}")
    return np.random.default_rng(np.random.SeedSequence(list(key)))


@dataclass(frozen=True)
class Identity:
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


def draw_identity(rng: np.random.Generator) -> Identity:
    """One identity's colours and proportions, from its own generator."""
    skin = SKIN_DARK + rng.uniform(0.0, 1.0) * (SKIN_LIGHT - SKIN_DARK)
    skin = skin + rng.normal(0.0, 6.0, 3)
    hair = rng.uniform(10.0, 90.0) * np.array([1.0, 0.8, 0.6]) + rng.normal(0.0, 8.0, 3)
    if rng.uniform() < 0.2:  # some blond or grey hair
        hair = hair + rng.uniform(60.0, 140.0)
    lips = skin * np.array([0.85, 0.55, 0.55]) + rng.normal(0.0, 5.0, 3)
    eye_col = rng.uniform(15.0, 70.0) * np.array([1.0, 0.9, 0.8])
    rx = float(rng.uniform(0.50, 0.60))
    ry = rx * float(rng.uniform(1.22, 1.40))
    # The draws' order is the generator's contract: every set generated so far depends on it.
    draws = [float(rng.uniform(low, high)) for low, high in FEATURE_RANGES]
    return Identity(skin, hair, lips, eye_col, rx, ry, *draws)


@dataclass(frozen=True)
class Shot:
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


def draw_shot(rng: np.random.Generator, face_scale: float, face_dy: float, noise: float) -> Shot:
    """One image's pose and lighting, from the image's generator; `noise` is the kind's noise
    amplitude before the per-image factor."""
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
    amp = noise * float(rng.lognormal(0.0, NOISE_SPREAD))
    return Shot(
        scale, cx, cy, roll, yaw, lx, ly, exposure, light, bg0, bg1, gx, gy, cloth, mouth_open, amp
    )
