"""A faster decode-and-transform with the seed's semantics: torchvision.io and uint8 tensors.

decode (libjpeg-turbo / libpng through torchvision.io, as PIL uses) -> RGB -> CelebA crop ->
Resize(112, 112) with antialiasing on a uint8 tensor -> the batch transforms (random crop,
normalize) on the whole batch. Pixels match PIL's path to within a grey level or so (resampling
rounds differently); DigiFace images are already 112x112 and are not resampled at all.
"""

from __future__ import annotations

import warnings

import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional

from facebench.data.images import CELEBA_BOX, bad_image
from facebench.data.sources import CELEBA
from facebench.data.transforms import RESIZE

# torchvision 0.29 warns on every call that its image codecs are deprecated in favour of
# TorchCodec; they are the ones pinned and tested here, and stay until the pin moves.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision",
    category=DeprecationWarning,
)


def decode_resized(data: bytes | torch.Tensor, source: str, name: str = "<bytes>") -> torch.Tensor:
    """Encoded JPEG/PNG bytes -> (112, 112, 3) uint8, HWC, as the seed prepared it."""
    if not isinstance(data, torch.Tensor):
        if not data:
            raise bad_image(name, ValueError("empty file"))
        data = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # a writable copy
    try:
        image = decode_image(data, mode=ImageReadMode.RGB)  # (3, H, W) uint8
    except RuntimeError as error:
        raise bad_image(name, error) from None
    return resize_sample(image, source)


def resize_sample(image: torch.Tensor, source: str) -> torch.Tensor:
    """(3, H, W) uint8 RGB -> cropped if CelebA, resized to 112x112, as (112, 112, 3)."""
    if source == CELEBA:
        left, top, right, bottom = CELEBA_BOX
        image = image[:, top:bottom, left:right]
    if tuple(image.shape[1:]) != RESIZE:
        image = functional.resize(image, list(RESIZE), antialias=True)
    return image.permute(1, 2, 0).contiguous()
