import io

import numpy as np
import pytest
from PIL import Image

from facebench.data.synthetic_images import (
    CELEBA_SIZE,
    DIGIFACE_SIZE,
    celeba_like_jpeg,
    digiface_like_png,
)


def _open(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def test_celeba_like_jpeg_format() -> None:
    img = _open(celeba_like_jpeg(3, 7, 0))
    assert img.format == "JPEG"
    assert img.mode == "RGB"
    assert img.size == CELEBA_SIZE == (178, 218)
    assert img.convert("RGB").size == (178, 218)


def test_digiface_like_png_format() -> None:
    img = _open(digiface_like_png(3, 7, 0))
    assert img.format == "PNG"
    assert img.mode == "RGBA"
    assert img.size == DIGIFACE_SIZE == (112, 112)
    alpha = np.asarray(img)[..., 3]
    # The matte is opaque on the face and transparent in the corners.
    assert alpha[56, 56] == 255
    assert alpha[0, 0] == 0
    assert img.convert("RGB").mode == "RGB"


@pytest.mark.parametrize("fn", [celeba_like_jpeg, digiface_like_png])
def test_deterministic(fn) -> None:
    first = fn(5, 2, 11)
    # Interleave other calls: scratch buffers are reused and must not leak state.
    fn(6, 0, 11)
    fn(5, 3, 11)
    assert fn(5, 2, 11) == first
    assert fn(5, 3, 11) != first
    assert fn(6, 2, 11) != first
    assert fn(5, 2, 12) != first


@pytest.mark.parametrize("fn", [celeba_like_jpeg, digiface_like_png])
def test_same_identity_looks_alike(fn) -> None:
    def pixels(identity: int, index: int) -> np.ndarray:
        return np.asarray(_open(fn(identity, index, 0)).convert("RGB"), dtype=np.float32)

    # Compare the central face region: same identity should be closer than a different one
    # on average, since skin, hair and proportions come from the identity alone.
    def face(a: np.ndarray) -> np.ndarray:
        h, w = a.shape[:2]
        return a[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4].mean(axis=(0, 1))

    same = [np.abs(face(pixels(i, 0)) - face(pixels(i, 1))).sum() for i in range(20)]
    diff = [np.abs(face(pixels(i, 0)) - face(pixels(i + 100, 1))).sum() for i in range(20)]
    assert np.mean(same) < np.mean(diff)


def test_rejects_negative_arguments() -> None:
    with pytest.raises(ValueError):
        celeba_like_jpeg(-1, 0, 0)
    with pytest.raises(ValueError):
        digiface_like_png(0, 0, -1)


def _sizes(fn, n: int = 200) -> np.ndarray:
    return np.array([len(fn(i // 10, i % 10, 0)) for i in range(n)])


def test_celeba_like_jpeg_sizes() -> None:
    sizes = _sizes(celeba_like_jpeg)
    assert 5_000 <= sizes.mean() <= 9_000
    assert sizes.std() > 200


def test_digiface_like_png_sizes() -> None:
    sizes = _sizes(digiface_like_png)
    assert 15_000 <= sizes.mean() <= 25_000
    assert sizes.std() > 200
