"""Pipelines as users write them, for loader=custom's tests: named by `_target_` as
tests.own_pipelines.<name>."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torchvision import datasets

from facebench.host.paths import PROJECT_ROOT

sys.path.append(str(PROJECT_ROOT / "bench"))  # the documented example, as a user's own module
from shopdata import shop_images  # noqa: E402


def write_folder(root: Path, classes: int = 2, per_class: int = 24, side: int = 48) -> Path:
    """An ImageFolder tree of small JPEGs: root/<class>/<n>.jpg."""
    rng = np.random.default_rng(0)
    for label in range(classes):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for number in range(per_class):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{number}.jpg", quality=90)
    return root


def image_folder(root: str, crop: int = 32) -> datasets.ImageFolder:
    """docs/own-pipeline.md's example (bench/shopdata.py): an ImageFolder with a typical v2
    augmentation stack, smaller crops for the suite."""
    return shop_images(root, crop)


class Numbers(IterableDataset):
    """0 .. n-1 as (image, label) samples; `sharded`: each worker yields its own share, as
    PyTorch's docs show, else every worker yields all of them."""

    def __init__(self, n: int = 64, sharded: bool = True) -> None:
        self.n = n
        self.sharded = sharded

    def __iter__(self):
        info = get_worker_info()
        start, step = 0, 1
        if self.sharded and info is not None:
            start, step = info.id, info.num_workers
        for number in range(start, self.n, step):
            yield torch.full((3, 8, 8), float(number)), number % 4


def dict_collate(samples: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    return {
        "pixels": torch.stack([image for image, _ in samples]),
        "label": torch.tensor([label for _, label in samples]),
    }


class Squares(Dataset):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == 13 and self.n == 17:  # Squares(n=17): one sample that fails
            raise ValueError("no such square")
        return torch.full((3, 8, 8), float(index)), index % 4


def whole_loader(n: int = 48, batch_size: int = 6, num_workers: int = 1) -> DataLoader:
    """A DataLoader of the user's own, with its own collate (dict batches)."""
    return DataLoader(
        Squares(n), batch_size=batch_size, num_workers=num_workers, collate_fn=dict_collate
    )


def hugging_face(n: int = 40):
    """A Hugging Face datasets.Dataset whose samples set_transform makes on the fly."""
    import datasets as hf

    table = hf.Dataset.from_dict({"value": list(range(n)), "label": [i % 3 for i in range(n)]})

    def to_tensors(batch: dict) -> dict:
        return {
            "pixels": [torch.full((3, 8, 8), float(v)) for v in batch["value"]],
            "label": batch["label"],
        }

    table.set_transform(to_tensors)
    return table


class Hoarder(Dataset):
    """A dataset holding millions of Python objects that reading a sample touches: its
    workers' memory grows as their reads copy the pages (PyTorch issue 13246)."""

    def __init__(self, n: int = 32, objects: int = 6_000_000) -> None:
        self.n = n
        self.objects = [str(number) for number in range(objects)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        chunk = math.ceil(len(self.objects) / self.n)
        touched = sum(len(text) for text in self.objects[index * chunk : (index + 1) * chunk])
        return torch.full((3, 4, 4), float(touched % 7)), index % 2


def not_a_dataset(size: int = 3) -> int:
    return size


def broken(root: str = "/nowhere") -> Dataset:
    raise FileNotFoundError(f"{root} holds no images")


def no_tensors(n: int = 16) -> list[list[str]]:
    return [["a", "b"] for _ in range(n)]


def bad_collate(samples: list) -> dict:
    raise KeyError("pixels")


class Stacker:
    """A collator class, built once with its settings."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def __call__(self, samples: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
        batch = dict_collate(samples)
        return {**batch, "pixels": batch["pixels"] * self.scale}


def scaled_collate(samples: list[tuple[torch.Tensor, int]], scale: float = 1.0) -> dict:
    batch = dict_collate(samples)
    return {**batch, "pixels": batch["pixels"] * scale}
