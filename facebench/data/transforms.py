"""The one preprocessing definition every loader uses: the article's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image
from torchvision import transforms

from facebench.config import Crop, choice

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESIZE = (112, 112)
CROP = (100, 100)


def article_transform(crop: str = "random") -> Callable[[Image.Image], torch.Tensor]:
    """Resize(112) -> RandomCrop(100) -> ToTensor -> Normalize(ImageNet).

    crop="center" swaps the random crop for a center crop, which makes every loader's output
    deterministic, so tests can compare loaders sample by sample.
    """
    random = choice(Crop, crop, "loader.crop") == Crop.random
    cropper = transforms.RandomCrop(CROP) if random else transforms.CenterCrop(CROP)
    return transforms.Compose(
        [
            transforms.Resize(RESIZE),
            cropper,
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
