"""The one preprocessing definition every loader uses: the article's, its sizes and statistics
configurable (`transform.resize`, `transform.crop`, `transform.mean`, `transform.std`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from PIL import Image
from torchvision import transforms

from facebench.config import Crop, choice

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Geometry:
    """Resize((resize, resize)) -> a crop x crop crop -> Normalize(mean, std): the sizes every
    loader, shard format and finishing step agree on. Any image, of any shape, is resized to a
    square (the aspect ratio is not kept), so every sample has the same size."""

    resize: int = 112
    crop: int = 100
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    @property
    def resized(self) -> tuple[int, int]:
        return (self.resize, self.resize)

    @property
    def cropped(self) -> tuple[int, int]:
        return (self.crop, self.crop)

    @classmethod
    def of(cls, transform: object) -> Geometry:
        """From the config's `transform` node (resize, crop, mean, std)."""
        return cls(
            resize=int(transform.resize),  # type: ignore[attr-defined]
            crop=int(transform.crop),  # type: ignore[attr-defined]
            mean=tuple(float(x) for x in transform.mean),  # type: ignore[attr-defined]
            std=tuple(float(x) for x in transform.std),  # type: ignore[attr-defined]
        )


ARTICLE = Geometry()  # Resize(112) -> RandomCrop(100) -> ImageNet statistics
RESIZE = ARTICLE.resized
CROP = ARTICLE.cropped


def article_transform(
    crop: str = "random", geometry: Geometry = ARTICLE
) -> Callable[[Image.Image], torch.Tensor]:
    """Resize(112) -> RandomCrop(100) -> ToTensor -> Normalize(ImageNet), or `geometry`'s sizes.

    crop="center" swaps the random crop for a center crop, which makes every loader's output
    deterministic, so tests can compare loaders sample by sample.
    """
    random = choice(Crop, crop, "loader.crop") == Crop.random
    size = geometry.cropped
    cropper = transforms.RandomCrop(size) if random else transforms.CenterCrop(size)
    return transforms.Compose(
        [
            transforms.Resize(geometry.resized),
            cropper,
            transforms.ToTensor(),
            transforms.Normalize(geometry.mean, geometry.std),
        ]
    )
