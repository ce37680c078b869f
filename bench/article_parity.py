"""Is loader=dataset as fast as the article's own Dataset pipeline? The two, alternated.

    python bench/article_parity.py                 # 20,000 synthetic images, 2 workers, 3 rounds

The article's pipeline is written here from the article's text (../shared/seed): its
CelebADataset and DigiFace1M classes, its transform (Resize(112), RandomCrop(100), ToTensor,
Normalize), ConcatDataset and DataLoader(shuffle=True, drop_last=True), iterated with no model.
Each side runs as a process of its own on the same tree, with the files in the page cache (a
facebench run with cache=warm goes first), and its rate is counted as facebench counts an epoch:
from building the loader to the last batch, worker start-up included. loader=dataset runs
host-only (it hands over the finished batch, as the article's loop receives it), as it runs by
default, with stage times off, and with the resource sampler off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from common import Bench, generated_root, parser, run_python, run_train
from PIL import Image
from torchvision import transforms

from facebench.report.tables import markdown

FACEBENCH = {
    "loader=dataset": [],
    "loader=dataset stage_times=false": ["stage_times=false"],
    "loader=dataset sample_hz=0": ["sample_hz=0"],
    "loader=dataset cache=keep": ["cache=keep"],
}
ARTICLE = "the article's code"


# The article's code, as printed in it: its two datasets here, its transform and their
# concatenation in article_dataset, its DataLoader in article_epoch.
class CelebADataset(torch.utils.data.Dataset):
    def __init__(self, data_path: str, transform: Callable | None) -> None:
        self.data_path = data_path
        self.transform = transform
        self.image_names, self.labels = self.load_labels(f"{data_path}/identity_CelebA.txt")

    def __len__(self) -> int:
        return len(self.image_names)

    def __getitem__(self, idx: int):
        image_path = f"{self.data_path}/img_align_celeba/{self.image_names[idx]}"
        image = Image.open(image_path)
        left, right, top, bottom = 25, 153, 45, 173
        image = image.crop((left, top, right, bottom))
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[idx]

    @staticmethod
    def load_labels(labels_path: str) -> tuple[list[str], list[int]]:
        image_names, labels = [], []
        with open(labels_path, encoding="utf-8") as labels_file:
            for line in labels_file.readlines():
                file_name, class_id = line.split(" ")
                image_names.append(file_name)
                labels.append(int(class_id[:-1]))
        return image_names, labels


class DigiFace1M(torch.utils.data.Dataset):
    def __init__(self, data_path: str, transform: Callable | None, add_to_class: int = 0) -> None:
        self.data_path = data_path
        self.transform = transform
        self.image_paths, self.labels = self.load_labels(data_path, add_to_class)

    def __len__(self) -> int:
        return len(self.image_paths)

    def __getitem__(self, idx: int):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[idx]

    @staticmethod
    def load_labels(data_path: str, add_to_class: int) -> tuple[list[str], list[int]]:
        image_paths, labels = [], []
        for folder, _, files in os.walk(data_path):
            for file_name in files:
                if file_name.endswith(".png"):
                    image_paths.append(f"{folder}/{file_name}")
                    labels.append(int(os.path.basename(folder)) + add_to_class)
        return image_paths, labels


def article_dataset(root: str) -> torch.utils.data.Dataset:
    """The article's two sets with its transform, concatenated, as its training script makes
    them."""
    transform = transforms.Compose(
        [
            transforms.Resize((112, 112)),
            transforms.RandomCrop(100),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    celeba = CelebADataset(f"{root}/CelebA", transform)
    digiface = DigiFace1M(f"{root}/DigiFace1M", transform, max(celeba.labels) + 1)
    return torch.utils.data.ConcatDataset([celeba, digiface])


def article_epoch(root: str, n_workers: int, batch_size: int) -> dict[str, float]:
    """One epoch of the article's Dataset pipeline, as printed in the article."""
    # The datasets are made before the clock, as facebench lists its data before it.
    dataset = article_dataset(root)
    started = time.perf_counter()
    loader = torch.utils.data.DataLoader(
        dataset=dataset,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=n_workers,
    )
    arrivals, images = [], 0
    for batch, _ in loader:
        images += len(batch)
        arrivals.append((time.perf_counter(), images))
    ended = time.perf_counter()
    # The steady rate as facebench's meter takes it: after a tenth of the batches (1 to 20).
    warmup = min(20, max(1, len(arrivals) // 10))
    (first_at, first_images), (last_at, last_images) = arrivals[warmup - 1], arrivals[-1]
    return {
        "images_per_s": images / (ended - started),
        "steady_images_per_s": (last_images - first_images) / (last_at - first_at),
    }


def article_run(root: str, n_workers: int, batch_size: int) -> dict[str, float]:
    """article_epoch in a process of its own (this script, with --article-epoch)."""
    epoch = [__file__, "--article-epoch", root, f"--n-workers={n_workers}"]
    result = run_python([*epoch, f"--batch-size={batch_size}"])
    return json.loads(result.stdout.strip().splitlines()[-1])


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    arguments.add_argument("--n-images", type=int, default=20_000)
    arguments.add_argument("--n-workers", type=int, default=2)
    arguments.add_argument("--batch-size", type=int, default=600)
    arguments.add_argument("--rounds", type=int, default=3)
    arguments.add_argument("--article-epoch", metavar="ROOT", help=argparse.SUPPRESS)
    return Bench.start(arguments, argv)


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Each pipeline once a round, each run a process of its own: their metrics, by pipeline."""
    common = [
        "model=none",
        "host_only=true",
        "cache=warm",
        f"n_workers={args.n_workers}",
        f"batch_size={args.batch_size}",
        f"data.n_images={args.n_images}",
    ]
    rates: dict[str, list[dict[str, float]]] = {ARTICLE: []}
    rates |= {name: [] for name in FACEBENCH}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.rounds):
            for name, extra in FACEBENCH.items():
                rates[name].append(run_train(scratch, [*common, "loader=dataset", *extra]))
            # The facebench run just read every file in: the article's finds them cached too.
            root = str(generated_root(args.n_images))
            rates[ARTICLE].append(article_run(root, args.n_workers, args.batch_size))
    return rates


def parity_table(rates: dict[str, list[dict[str, float]]]) -> str:
    """Each pipeline's median rates, whole epoch and steady, as ratios to the article's too."""
    base = {
        key: statistics.median(run[key] for run in rates[ARTICLE])
        for key in ("images_per_s", "steady_images_per_s")
    }
    rows = []
    for name, runs in rates.items():
        whole = statistics.median(run["images_per_s"] for run in runs)
        steady = statistics.median(run["steady_images_per_s"] for run in runs)
        rows.append(
            [
                name,
                f"{whole:,.0f}",
                f"{whole / base['images_per_s']:.2f}x",
                f"{steady:,.0f}",
                f"{steady / base['steady_images_per_s']:.2f}x",
                ", ".join(f"{run['images_per_s']:,.0f}" for run in runs),
            ]
        )
    header = ["pipeline", "images/s (median)", "vs the article's", "steady images/s"]
    return markdown([*header, "vs the article's", "each round"], rows)


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    args = bench.args
    if args.article_epoch:
        print(json.dumps(article_epoch(args.article_epoch, args.n_workers, args.batch_size)))
        return
    rates = measure(args)
    title = (
        f"loader=dataset against the article's own code, {args.n_images:,} synthetic images, "
        f"{args.n_workers} workers, batch {args.batch_size}, warm, no model"
    )
    details = (
        f"{args.rounds} rounds, the pipelines alternated in each, every run a process of its "
        "own; nothing else ran meanwhile"
    )
    bench.publish("bench:article-parity", bench.section(title, details, parity_table(rates)))


if __name__ == "__main__":
    main()
