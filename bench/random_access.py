"""What one sample read at random costs from Parquet (row groups of 10 to 1,000 samples) and from
Lance (fragments of 1,000 and 10,000): the reads (each a ranged GET from a bucket) and the bytes
they fetch, and the time on this machine's disk, warm.

    python bench/random_access.py                   # 6,000 synthetic images, 300 random samples
    python bench/random_access.py --samples 100

Parquet is read with pyarrow, as datasets' streaming reader does, through a file object that
counts each read and its bytes: a sample is a read of its row group's image column chunk (plus
the footer, once per file, not counted here). Lance is read with take([row]), its reads and bytes
from dataset.io_stats_incremental(). Each figure is the mean over the same random samples. The
time from a bucket is what those reads cost one after another at a first byte of 20 ms: not
measured here, and stated as that product. Table `random-access`.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from common import Bench, generated_root, parser

from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.shards.build import ensure_shards

FIRST_BYTE_S = 0.020  # S3 Standard's median first byte, as storage=s3 emulates it


class Counted(io.RawIOBase):
    """A file whose reads are counted: what pyarrow would ask a bucket for, one GET each."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "rb")  # noqa: SIM115 - closed with this object
        self.reads = 0
        self.bytes = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        data = self.file.read(len(buffer))
        buffer[: len(data)] = data
        self.reads += 1
        self.bytes += len(data)
        return len(data)

    def close(self) -> None:
        self.file.close()
        super().close()


def parquet_row(root: Path, scratch: Path, row_group: int, picks: np.ndarray) -> list[str]:
    import pyarrow.parquet as pq

    built = ensure_shards(
        root, scratch / f"parquet-{row_group}", "parquet", shard_size=1000, row_group_size=row_group
    )
    files = [built.folder / shard.name for shard in built.manifest.shards]
    sources = {path: Counted(path) for path in files}
    # Each file's footer is read on opening: once per file, left out of a sample's reads.
    opened = {path: pq.ParquetFile(source, pre_buffer=False) for path, source in sources.items()}
    reads, fetched, seconds = [], [], []
    for pick in picks:
        path, row = files[pick // 1000], pick % 1000
        found, source = opened[path], sources[path]
        start_reads, start_bytes = source.reads, source.bytes
        started = time.perf_counter()
        group = found.read_row_group(row // row_group, columns=["image"])
        group.column("image")[row % row_group].as_py()
        seconds.append(time.perf_counter() - started)
        reads.append(source.reads - start_reads)
        fetched.append(source.bytes - start_bytes)
    return _row(f"parquet, row groups of {row_group:,}", reads, fetched, seconds)


def lance_row(root: Path, scratch: Path, fragment: int, picks: np.ndarray) -> list[str]:
    import lance

    built = ensure_shards(root, scratch / f"lance-{fragment}", "lance", shard_size=fragment)
    dataset = lance.dataset(str(built.folder))
    dataset.io_stats_incremental()
    reads, fetched, seconds = [], [], []
    for pick in picks:
        started = time.perf_counter()
        dataset.take([int(pick)], columns=["image"]).column("image")[0].as_py()
        seconds.append(time.perf_counter() - started)
        stats = dataset.io_stats_incremental()
        reads.append(stats.read_iops)
        fetched.append(stats.read_bytes)
    return _row(f"lance, fragments of {fragment:,}", reads, fetched, seconds)


def _row(name: str, reads: list[int], fetched: list[int], seconds: list[float]) -> list[str]:
    mean_reads = statistics.mean(reads)
    return [
        name,
        f"{mean_reads:.1f}",
        f"{statistics.mean(fetched) / 1e3:,.1f}",
        f"{statistics.median(seconds) * 1e3:.2f}",
        f"{mean_reads * FIRST_BYTE_S * 1e3:.0f}",
    ]


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=6000)
    arguments.add_argument("--samples", type=int, default=300)
    bench = Bench.start(arguments)
    args = bench.args
    ensure_synthetic(cache_dir(""), args.images, 0, n_procs=2)
    root = generated_root(args.images)
    picks = np.random.default_rng(0).choice(args.images, size=args.samples, replace=False)
    with tempfile.TemporaryDirectory() as scratch:
        rows = [parquet_row(root, Path(scratch), n, picks) for n in (10, 100, 1000)]
        rows += [lance_row(root, Path(scratch), n, picks) for n in (1000, 10_000)]
    header = [
        "set", "reads a sample", "KB fetched a sample", "ms a sample (disk, warm)",
        "ms a sample at 20 ms a read, in turn",
    ]  # fmt: skip
    mean_kb = statistics.mean(p.stat().st_size for p in root.rglob("*.*g")) / 1e3
    details = (
        f"{args.images:,} synthetic images (a file {mean_kb:.1f} KB on average), "
        f"{args.samples} samples drawn at random (seed 0), the same for every set; Parquet "
        "files of 1,000 samples read with pyarrow (pre_buffer off, each read counted), Lance "
        "with take([row]) (its io_stats); nothing else ran"
    )
    body = markdown(header, rows)
    bench.publish("random-access", bench.section("One sample at random", details, body))


if __name__ == "__main__":
    main()
