"""A user's training loop on the GPU, its loader watched: the check bench/gpu_check.py runs so
that `watch` meets a real GPU (CUDA events, NVML, AMP) the first time facebench does.

    python bench/watched_loop.py ROOT OUT [--workers N] [--batch-size B] [--dry-run]

ROOT: a folder set (`python -m facebench.generate --layout folder`), read by an ImageFolder with
bench/shopdata.py's v2 augmentations; ResNet-18 under AMP (fp16) on the current CUDA device, or,
--dry-run, a few batches on the CPU in fp32. Writes OUT/results.json (watch's record, MLflow
off) and prints the line gpu_check.py reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision.models import resnet18

from facebench import watch
from facebench.host.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
from shopdata import shop_images  # noqa: E402  (the documented example, as a user's module)


def train(root: str, out: Path, workers: int, batch_size: int, dry: bool) -> dict[str, float]:
    """One epoch (a few batches, dry) of the loop, watched; its metrics."""
    device = torch.device("cpu" if dry else "cuda")
    dataset = shop_images(root, 112)
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=not dry
    )
    model = resnet18(num_classes=len(dataset.classes)).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(enabled=not dry)
    for step, (images, labels) in enumerate(watch(loader, tracking=False, folder=out)):
        images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.float16, enabled=not dry):
            loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if dry and step == 2:
            break
    return json.loads((out / "results.json").read_text())["metrics"]


def line(metrics: dict[str, float]) -> str:
    """What the watched loop measured, in gpu_check.py's list of findings."""
    waited = metrics.get("gpu_data_wait_frac")
    gpu = f"the GPU waited for data {waited:.0%} (CUDA events)" if waited is not None else ""
    util = metrics.get("gpu_util_mean")
    nvml = f", NVML utilization {util:.0f}%" if util is not None else ""
    loop = f"the loop waited {metrics['data_wait_frac']:.0%}"
    return (
        f"watched loop (ImageFolder, ResNet-18 AMP): {metrics['images_per_s']:,.0f} images/s; "
        f"{gpu or 'no CUDA events'}{nvml}; {loop}"
    )


def checked(
    cache: Path, n_images: int, workers: int, batch_size: int, dry: bool, scratch: Path
) -> str:
    """gpu_check.py's step: this script in a process of its own on a generated folder set (at
    most 20,000 images); its line, or what failed."""
    from common import run_python

    size = str(min(n_images, 20_000))
    made = run_python(
        [
            "-m",
            "facebench.generate",
            "--layout",
            "folder",
            "--n-images",
            size,
            "--cache-dir",
            str(cache),
        ],
        check=False,
    )
    if made.returncode != 0:
        return f"watched loop: no folder set ({made.stderr.strip()[-300:]})"
    command = ["bench/watched_loop.py", made.stdout.strip(), str(scratch / "watched")]
    command += ["--workers", str(workers), "--batch-size", str(batch_size)]
    result = run_python(command + (["--dry-run"] if dry else []), scratch / "watched.log", False)
    said = result.stdout.strip().splitlines()
    if result.returncode != 0 or not said:
        return f"watched loop failed: see {scratch / 'watched.log'}"
    return said[-1]


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__)
    arguments.add_argument("root")
    arguments.add_argument("out", type=Path)
    arguments.add_argument("--workers", type=int, default=8)
    arguments.add_argument("--batch-size", type=int, default=256)
    arguments.add_argument("--dry-run", action="store_true")
    args = arguments.parse_args()
    metrics = train(args.root, args.out, args.workers, args.batch_size, args.dry_run)
    print(line(metrics))


if __name__ == "__main__":
    main()
