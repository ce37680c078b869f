"""Which items should LitData's chunks hold: the encoded files, or decoded 112x112 uint8 samples?

    python bench/litdata_items.py                   # 20,000 synthetic images, n_workers 2

Writes the same samples twice with litdata.optimize, once as the files' bytes (decoded, cropped and
resized in the reading workers, as webdataset does) and once decoded (as raw stores them), then
reads each with StreamingDataset/StreamingDataLoader, warm, and prints images/s and disk per
format. facebench.shards.litdata_format follows the answer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import Bench
from torchvision.transforms import functional

from facebench.data.images import decode_sample, open_sample
from facebench.data.sources import read_records
from facebench.data.synthetic import ensure_synthetic
from facebench.data.transforms import RESIZE
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown


def encoded_item(sample: tuple[int, str, str, int]) -> dict:
    index, path, source, label = sample
    with open(path, "rb") as file:
        data = file.read()
    return {"data": data, "source": source, "id": index, "label": label}


def decoded_item(sample: tuple[int, str, str, int]) -> dict:
    index, path, source, label = sample
    image = functional.resize(open_sample(path, source), list(RESIZE))
    return {"image": np.asarray(image), "id": index, "label": label}


def decode(item: dict) -> dict:
    if "data" in item:
        image = decode_sample(item["data"], item["source"], str(item["id"]))
        item = {"image": np.asarray(functional.resize(image, list(RESIZE))), **item}
    return item


def write(folder: Path, samples: list, fn) -> None:
    import litdata

    litdata.optimize(
        fn=fn,
        inputs=samples,
        output_dir=str(folder),
        chunk_bytes="64MB",
        num_workers=os.cpu_count() or 1,
        start_method="fork",
        mode="overwrite",
    )


def read(folder: Path, batch_size: int, n_workers: int, cache: Path) -> float:
    """Images/s of one full pass (after one warm-up pass that fills the page cache)."""
    from litdata import StreamingDataLoader, StreamingDataset

    class Decoded(StreamingDataset):
        def __getitem__(self, index):
            return decode(super().__getitem__(index))

    def collate(items: list[dict]) -> np.ndarray:
        return np.stack([item["image"] for item in items])

    rate = 0.0
    for _ in range(2):
        shutil.rmtree(cache, ignore_errors=True)
        dataset = Decoded(input_dir=str(folder), cache_dir=str(cache), shuffle=True)
        loader = StreamingDataLoader(
            dataset, batch_size=batch_size, num_workers=n_workers, collate_fn=collate
        )
        start, count = time.perf_counter(), 0
        for batch in loader:
            count += len(batch)
        rate = count / (time.perf_counter() - start)
    return rate


def disk(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir())


def main(argv: list[str] | None = None) -> None:
    # Its answer is in facebench/shards/litdata_format.py: it prints, and writes no docs section.
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--n-images", type=int, default=20_000)
    arguments.add_argument("--workers", type=int, default=2)
    arguments.add_argument("--batch-size", type=int, default=600)
    bench = Bench.start(arguments, argv)
    args = bench.args
    root = ensure_synthetic(cache_dir(), args.n_images)
    records, _ = read_records(root)
    samples = [(i, r.path, r.source, r.label) for i, r in enumerate(records)]
    rows = []
    with tempfile.TemporaryDirectory(dir=cache_dir()) as scratch:
        for name, fn in (("encoded files", encoded_item), ("decoded uint8", decoded_item)):
            folder = Path(scratch) / name.replace(" ", "-")
            write(folder, samples, fn)
            rate = read(folder, args.batch_size, args.workers, Path(scratch) / "reader-cache")
            rows.append([name, f"{rate:,.0f}", f"{disk(folder) / 2**30:.2f}"])
    title = "LitData's items: encoded files or decoded uint8 samples"
    details = (
        f"{args.n_images:,} synthetic images, warm, batch {args.batch_size}, "
        f"n_workers {args.workers}"
    )
    print(bench.section(title, details, markdown(["items", "images/s", "disk (GiB)"], rows)))


if __name__ == "__main__":
    main()
