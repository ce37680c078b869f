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
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    command_line,
    load_note,
    machine,
    run_train,
    stamp,
    steady_cell,
    table,
    write_section,
)

from facebench import loaders
from facebench.data.synthetic import synthetic_root
from facebench.paths import PROJECT_ROOT, cache_dir
from facebench.shards import formats

LOADERS = loaders.names(real_only=True)  # the registry's, never written out
FORMATS = formats.names()


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def prepare(n_images: int, fmt: str) -> float:
    """Seconds `python prepare.py` takes to build this format from scratch, start-up included."""
    shutil.rmtree(synthetic_root(cache_dir(), n_images, 0) / "facebench-shards" / fmt, True)
    started = time.perf_counter()
    command = [
        sys.executable,
        str(PROJECT_ROOT / "prepare.py"),
        f"format={fmt}",
        f"data.n_images={n_images}",
        "hydra.run.dir=/tmp/facebench-scale-prepare",
    ]
    print("running prepare.py", fmt, n_images, file=sys.stderr, flush=True)
    subprocess.run(command, check=True, capture_output=True)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", type=int, default=[20_000, 100_000, 300_000])
    parser.add_argument("--loaders", nargs="+", default=LOADERS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=600)
    parser.add_argument("--full-epoch-limit", type=int, default=20_000)
    parser.add_argument("--max-batches", type=int, default=60)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load = load_note()
    rows, disk = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for n_images in args.sizes:
            built = {fmt: prepare(n_images, fmt) for fmt in FORMATS}
            disk += disk_rows(n_images, built)
            capped = n_images > args.full_epoch_limit
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
    text = (
        f"### How cost grows with the data: loader-only, warm, n_workers {args.workers}, "
        f"batch {args.batch_size}\n\n"
        f"{stamp()}; {machine()}. `{command_line('scale.py', argv)}`; one epoch "
        f"per row, sets over {args.full_epoch_limit:,} images timed over their first "
        f"{args.max_batches} batches; {load}.\n\n"
        + table(header, rows)
        + "\nDisk per format, and `prepare.py` build time (2 processes):\n\n"
        + table(["images", "format", "build s", "disk GiB", "vs originals"], disk)
    )
    print(text)
    if not args.no_write:
        write_section("bench:scale", text)


if __name__ == "__main__":
    main()
