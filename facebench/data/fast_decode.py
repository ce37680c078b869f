"""A faster decode-and-transform with the seed's semantics: torchvision.io and uint8 tensors.

JPEGs decode with torchvision.io (libjpeg-turbo, as PIL uses, without PIL's per-image overhead);
PNGs decode with PIL, because torchvision 0.29's PNG decoder crashes the process on some damaged
files (libpng's error jumps past its handler) where PIL raises an error. Then RGB -> CelebA crop ->
Resize(112, 112) with antialiasing on a uint8 tensor -> the batch transforms (random crop,
normalize) on the whole batch. Pixels match PIL's path to within a few grey levels (resampling
rounds differently); DigiFace images are already 112x112 and are not resampled at all.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional

from facebench.data.images import CELEBA_BOX, bad_image, decode_sample
from facebench.data.sources import CELEBA
from facebench.data.transforms import RESIZE

# torchvision 0.29 warns on every call that its image codecs are deprecated in favour of
# TorchCodec; they are the ones pinned and tested here, and stay until the pin moves.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision",
    category=DeprecationWarning,
)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def decode_resized(data: bytes, source: str, name: str = "<bytes>") -> torch.Tensor:
    """Encoded JPEG/PNG bytes -> (112, 112, 3) uint8, HWC, as the seed prepared it."""
    if not data:
        raise bad_image(name, ValueError("empty file"))
    if data[:8] == _PNG_SIGNATURE or not data.startswith(b"\xff\xd8"):
        # PNGs, and anything that is not a JPEG, go through PIL (see the module docstring).
        rgb = np.asarray(decode_sample(data, source, name))  # RGB, CelebA already cropped
        image = torch.from_numpy(rgb.copy()).permute(2, 0, 1)
        return resize_sample(image, source, cropped=True)
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # a writable copy
    try:
        image = decode_image(encoded, mode=ImageReadMode.RGB)  # (3, H, W) uint8
    except RuntimeError as error:
        raise bad_image(name, error) from None
    return resize_sample(image, source)


def resize_sample(image: torch.Tensor, source: str, cropped: bool = False) -> torch.Tensor:
    """(3, H, W) uint8 RGB -> cropped if CelebA (unless already), 112x112, as (112, 112, 3)."""
    if source == CELEBA and not cropped:
        left, top, right, bottom = CELEBA_BOX
        image = image[:, top:bottom, left:right]
    if tuple(image.shape[1:]) != RESIZE:
        image = functional.resize(image, list(RESIZE), antialias=True)
    return image.permute(1, 2, 0).contiguous()
