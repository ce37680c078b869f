"""How each loader's cost grows with the data: 20,000, 100,000 and 300,000 synthetic images.

    python bench/scale.py                                   # about an hour on 2 cores
    python bench/scale.py --sizes 20000 100000 --loaders raw dataset

For each size: generate the synthetic set, rebuild every shard format with `prepare.py` (build
time and disk per format), then run every loader loader-only (model=none), warm, n_workers 2,
with `host_only` false and true, each as its own `python train.py` process, MLflow off. Sets
larger than --full-epoch-limit images are measured over their first --max-batches batches:
start-up, listing and the first batch are whole-set costs either way, and the steady rate settles
long before.
Writes two tables into docs/benchmarks.md (--no-write to skip).

    python bench/scale.py --memory                          # the article's memory question

Worker processes against threads: `dataset`, `datapipe` and `nodes` with --memory-workers (10)
worker processes, `spdl` with as many threads, on the 20,000- and 300,000-image sets: memory
added (the machine's used memory at its peak, less before the run) and images/s, in one table.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from common import Bench, parser, run_python, run_train, steady_cell

from facebench import loaders
from facebench.data.synthetic import synthetic_root
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.shards import formats

LOADERS = loaders.names(real_only=True)  # the registry's, never written out
FORMATS = formats.names()


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def prepare(n_images: int, fmt: str) -> float:
    """Seconds `python prepare.py` takes to build this format from scratch, start-up included."""
    shutil.rmtree(synthetic_root(cache_dir(), n_images, 0) / "facebench-shards" / fmt, True)
    started = time.perf_counter()
    run_python(
        [
            "prepare.py",
            f"format={fmt}",
            f"data.n_images={n_images}",
            "hydra.run.dir=/tmp/facebench-scale-prepare",
        ]
    )
    return time.perf_counter() - started


def disk_rows(n_images: int, built: dict[str, float]) -> list[list[str]]:
    root = synthetic_root(cache_dir(), n_images, 0)
    shards = root / "facebench-shards"
    originals = folder_bytes(root) - folder_bytes(shards)
    rows = [[f"{n_images:,}", "original files", "", f"{originals / 2**30:.2f}", "1.00x"]]
    for fmt in FORMATS:
        size = folder_bytes(shards / fmt)
        rows.append(
            [
                f"{n_images:,}",
                fmt,
                f"{built[fmt]:,.0f}",
                f"{size / 2**30:.2f}",
                f"{size / originals:.2f}x",
            ]
        )
    return rows


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    # Default: 20,000, 100,000 and 300,000 (with --memory: 20,000 and 300,000).
    arguments.add_argument("--sizes", nargs="+", type=int)
    arguments.add_argument("--loaders", nargs="+", default=LOADERS)
    arguments.add_argument("--workers", type=int, default=2)
    arguments.add_argument("--batch-size", type=int, default=600)
    arguments.add_argument("--full-epoch-limit", type=int, default=20_000)
    arguments.add_argument("--max-batches", type=int, default=60)
    arguments.add_argument("--memory", action="store_true", help="processes against threads")
    arguments.add_argument("--memory-workers", type=int, default=10)
    return Bench.start(arguments, argv)


# Processes (the article's loaders and nodes) against threads (spdl), at the same worker count.
MEMORY_LOADERS = ["dataset", "datapipe", "nodes", "spdl"]
MEMORY_SIZES = [20_000, 300_000]
SIZES = [20_000, 100_000, 300_000]


def memory_section(bench: Bench, scratch: str) -> str:
    """Memory added and images/s at --memory-workers processes or threads, per set size."""
    args = bench.args
    rows = []
    for n_images in args.sizes or MEMORY_SIZES:
        capped = n_images > args.full_epoch_limit
        for loader in MEMORY_LOADERS:
            m = run_train(
                scratch,
                [
                    f"loader={loader}",
                    f"n_workers={args.memory_workers}",
                    f"batch_size={args.batch_size}",
                    f"data.n_images={n_images}",
                    f"max_batches={args.max_batches if capped else 0}",
                    "host_only=true",
                    "model=none",
                    "cache=warm",
                    "repeat=1",
                ],
            )
            kind = loaders.get(loader).traits_for().workers
            rows.append(
                [
                    f"{n_images:,}",
                    loader,
                    f"{args.memory_workers} {'processes' if kind == 'process' else 'threads'}",
                    f"{m['peak_mem_added_mb']:,.0f}",
                    steady_cell(m),
                    f"{m['time_to_first_batch_s']:.2f}",
                ]
            )
    header = ["images", "loader", "workers", "memory added MB", "steady images/s", "first batch s"]
    title = (
        f"Worker processes against threads: memory and rate at n_workers {args.memory_workers}, "
        f"host side, warm, batch {args.batch_size}"
    )
    details = (
        f"one epoch per row, sets over {args.full_epoch_limit:,} images timed over their first "
        f"{args.max_batches} batches"
    )
    return bench.section(title, details, markdown(header, rows))


def loader_rows(args: argparse.Namespace, n_images: int, scratch: str) -> list[list[str]]:
    """Every loader on this set, host_only false then true: one train.py job and row each."""
    capped = n_images > args.full_epoch_limit
    rows = []
    for host_only in ("false", "true"):
        for loader in args.loaders:
            m = run_train(
                scratch,
                [
                    f"loader={loader}",
                    f"n_workers={args.workers}",
                    f"batch_size={args.batch_size}",
                    f"data.n_images={n_images}",
                    f"host_only={host_only}",
                    f"max_batches={args.max_batches if capped else 0}",
                    "model=none",
                    "cache=warm",
                    "repeat=1",
                ],
            )
            rows.append(
                [
                    f"{n_images:,}",
                    loader,
                    "yes" if host_only == "true" else "no",
                    f"{m['listing_s']:.2f}",
                    f"{m['time_to_first_batch_s']:.2f}",
                    steady_cell(m),
                    f"{m['peak_mem_added_mb']:,.0f}",
                    f"{m['samples_seen']:,.0f}",
                ]
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    args = bench.args
    if args.memory:
        with tempfile.TemporaryDirectory() as scratch:
            bench.publish("bench:threads-memory", memory_section(bench, scratch))
        return
    rows, disk = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for n_images in args.sizes or SIZES:
            built = {fmt: prepare(n_images, fmt) for fmt in FORMATS}
            disk += disk_rows(n_images, built)
            rows += loader_rows(args, n_images, scratch)
    header = [
        "images",
        "loader",
        "host only",
        "listing s",
        "first batch s",
        "steady images/s",
        "memory added MB",
        "images timed",
    ]
    title = (
        f"How cost grows with the data: loader-only, warm, n_workers {args.workers}, "
        f"batch {args.batch_size}"
    )
    details = (
        f"one epoch per row, sets over {args.full_epoch_limit:,} images timed over their first "
        f"{args.max_batches} batches"
    )
    body = (
        markdown(header, rows)
        + "\nDisk per format, and `prepare.py` build time (2 processes):\n\n"
        + markdown(["images", "format", "build s", "disk GiB", "vs originals"], disk)
    )
    bench.publish("bench:scale", bench.section(title, details, body))


if __name__ == "__main__":
    main()
