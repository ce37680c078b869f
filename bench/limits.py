"""How close do the decoding loaders come to what this machine can decode? Its decode limits,
measured on the data set's own files with no loader around them, beside each loader's rate.

    python bench/limits.py                      # 20,000 synthetic images, warm

A limit is the rate of one process per usable core, running together, each working through its
share of every file (read from the page cache): read + decode + resize to transform.resize with
PIL (what dataset and datapipe do first), the same plus the article's per-sample transform (crop,
to-tensor, normalize: all their work), and read + decode + resize with torchvision.io (what
webdataset and nodes do with decoder=torchvision; the device crops and normalizes). Each decoding
loader then runs host-only with n_workers equal to the cores, and its rate is given as a share of
its matching limit.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

import torch
from common import (
    command_line,
    generated_root,
    load_note,
    machine,
    run_train,
    stamp,
    table,
    write_section,
)
from PIL import Image

from facebench.data.fast_decode import decode_resized
from facebench.data.images import open_sample, read_file
from facebench.data.sources import CELEBA, DIGIFACE
from facebench.data.transforms import article_transform
from facebench.resources import usable_cores

# Which limit each decoding loader is held against (its own decoding path).
MATCHING = {
    "dataset": "PIL, article transform",
    "datapipe": "PIL, article transform",
    "webdataset": "torchvision.io, resize",
    "nodes": "torchvision.io, resize",
}


def _files(root: Path) -> list[tuple[str, str]]:
    celeba = sorted((root / CELEBA / "img_align_celeba").glob("*.jpg"))
    digiface = sorted((root / DIGIFACE).glob("*/*.png"))
    return [(str(p), CELEBA) for p in celeba] + [(str(p), DIGIFACE) for p in digiface]


def _work(kind: str, files: list[tuple[str, str]]) -> None:
    if kind == "torchvision.io, resize":
        for path, source in files:
            decode_resized(read_file(path), source, path)
        return
    if kind == "PIL, resize":
        for path, source in files:
            open_sample(path, source).resize((112, 112), Image.Resampling.BILINEAR)
        return
    transform = article_transform()
    for path, source in files:
        transform(open_sample(path, source))


def _one(args: tuple[str, list[tuple[str, str]], object]) -> None:
    kind, files, barrier = args
    torch.set_num_threads(1)  # as DataLoader sets in its workers: one core, one thread
    barrier.wait()
    _work(kind, files)


def limit(kind: str, files: list[tuple[str, str]], processes: int) -> float:
    """Images/s of `processes` processes, each on its share of the files, started together."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes + 1)
    shares = [files[i::processes] for i in range(processes)]
    workers = [context.Process(target=_one, args=((kind, share, barrier),)) for share in shares]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"a {kind} process failed ({worker.exitcode})")
    return len(files) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-images", type=int, default=20_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load = load_note()
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as scratch:
        common = ["model=none", "host_only=true", "cache=warm", f"data.n_images={args.n_images}"]
        rates = {
            name: run_train(scratch, [f"loader={name}", f"n_workers={cores}", *common])
            for name in MATCHING
        }
    # The loaders' runs just read every file into the page cache.
    files = _files(generated_root(args.n_images))
    kinds = ["PIL, resize", "PIL, article transform", "torchvision.io, resize"]
    limits = {kind: limit(kind, files, cores) for kind in kinds}
    limit_rows = [[kind, f"{rate:,.0f}"] for kind, rate in limits.items()]
    rows = []
    for name, metrics in rates.items():
        kind = MATCHING[name]
        steady = metrics["steady_images_per_s"]
        rows.append(
            [
                name,
                kind,
                f"{steady:,.0f}",
                f"{limits[kind]:,.0f}",
                f"{100 * steady / limits[kind]:.0f}%",
            ]
        )
    text = (
        f"### Decode limits and each decoding loader's share, {args.n_images:,} synthetic "
        f"images, warm, host side, n_workers {cores}\n\n"
        f"{stamp()}; {machine()}. `{command_line('limits.py', argv)}`; limits: {cores} "
        f"processes together, one share of the {len(files):,} files each; {load}, nothing else "
        "ran meanwhile.\n\n"
        + table(["limit", "images/s"], limit_rows)
        + "\n"
        + table(["loader", "its limit", "steady images/s", "limit", "share"], rows)
    )
    print(text)
    if not args.no_write:
        write_section("bench:decode-limits", text)


if __name__ == "__main__":
    main()
