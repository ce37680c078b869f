"""Parquet and Lance beside pickle, WebDataset tars and LitData: from this machine's disk, and
from a bucket at S3 Standard's emulated distance (20 ms median first byte, p99 100 ms, answered
from the relay's copy), with Parquet's row group size and Lance's fragment size swept.

    python bench/columnar.py                         # 6,000 synthetic images, n_workers=2
    python bench/columnar.py --images 2000 --runs 1

Each configuration is prepared (prepare.py storage=s3 builds the set here and uploads it beside
the data, replacing the previous setting's), run once from the disk to warm up, then `runs`
times from each place, alternated (disk, bucket). Host side only (model=none host_only=true).
The table gives images/s, and from the bucket the GETs and MB an epoch read (of the set's MB):
what each format's access pattern costs in requests. Table `columnar`.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

from common import Bench, generated_root, parser, run_python, run_train

from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.storage import client, server
from facebench.storage.address import parse
from facebench.storage.sync import upload_tree

# (the table's name for it, its format, its overrides), in the table's order.
CONFIGS = [
    ("pickle", "pickle", ["loader=pickle"]),
    ("webdataset (tar)", "tar", ["loader=webdataset"]),
    ("litdata", "litdata", ["loader=litdata"]),
    *(
        (f"parquet map, row groups of {n}", "parquet", ["loader=parquet", f"row_group_size={n}"])
        for n in (10, 100, 1000)
    ),
    *(
        (
            f"parquet streaming, row groups of {n}",
            "parquet",
            ["loader=parquet", "loader.mode=streaming", f"row_group_size={n}"],
        )
        for n in (10, 100, 1000)
    ),
    *(
        (f"lance, fragments of {n:,}", "lance", ["loader=lance", f"shard_size={n}"])
        for n in (100, 1000, 10_000)
    ),
]


def set_mb(root: Path, shard_format: str) -> float:
    """The local set's bytes, from its manifest, in MB."""
    manifest = json.loads((root / "facebench-shards" / shard_format / "manifest.json").read_text())
    return sum(shard["bytes"] for shard in manifest["shards"]) / 1e6


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=6000)
    arguments.add_argument("--runs", type=int, default=2)
    arguments.add_argument("--workers", type=int, default=2)
    arguments.add_argument("--batch-size", type=int, default=100)
    bench = Bench.start(arguments)
    args = bench.args
    ensure_synthetic(cache_dir(""), args.images, 0, n_procs=2)
    root = generated_root(args.images)
    data = [f"data.n_images={args.images}", f"batch_size={args.batch_size}"]
    common = [*data, "model=none", "host_only=true", f"n_workers={args.workers}"]
    rows = []
    with tempfile.TemporaryDirectory() as scratch, server.local_server(Path(scratch) / "s3") as s3:
        os.environ.update(s3.environment())
        client.configure(client.Endpoint(s3.endpoint, server.REGION, True))
        url = f"s3://{server.BUCKET}/columnar{args.images}"
        upload_tree(root, parse(url))
        for name, shard_format, keys in CONFIGS:
            settings = [key for key in keys if not key.startswith("loader")]
            run_python(
                [
                    "prepare.py",
                    *s3.overrides(url, emulate=False),
                    *data,
                    *settings,
                    f"format={shard_format}",
                ]
            )
            places = {"disk": [], "bucket": s3.overrides(url)}  # the bucket at 20 ms
            found: dict[str, list[dict[str, float]]] = {"disk": [], "bucket": []}
            run_train(scratch, [*keys, *common])  # warm-up
            for _ in range(args.runs):
                for place, where in places.items():
                    found[place].append(run_train(scratch, [*keys, *common, *where]))
            rows.append(_row(name, found, set_mb(root, shard_format)))
    header = [
        "loader", "disk images/s", "bucket images/s", "bucket GETs an epoch",
        "bucket MB an epoch (set MB)", "GET p50 / p99 ms",
    ]  # fmt: skip
    details = (
        f"{args.images:,} synthetic images, `model=none host_only=true n_workers={args.workers} "
        f"batch_size={args.batch_size}`; each configuration warmed up once from the disk, then "
        f"{args.runs} runs from each place alternated, medians; the bucket: the local object "
        "server behind the emulated distance of S3 Standard (20 ms, p99 100 ms), answered from "
        "the relay's copy; Parquet files and tars of 300 samples (cut so that 16 workers each "
        "get one); parquet map reads datasets' Arrow copy (made in set-up, from the bucket "
        "there); nothing else ran"
    )
    bench.publish("columnar", bench.section("Parquet and Lance", details, markdown(header, rows)))


def _row(name: str, found: dict[str, list[dict[str, float]]], megabytes: float) -> list[str]:
    def median(place: str, key: str) -> float:
        return statistics.median(run.get(key, 0.0) for run in found[place])

    requests = median("bucket", "storage_requests")
    read = median("bucket", "storage_bytes") / 1e6
    p50, p99 = median("bucket", "storage_get_p50_ms"), median("bucket", "storage_get_p99_ms")
    return [
        name, f"{median('disk', 'images_per_s'):,.0f}", f"{median('bucket', 'images_per_s'):,.0f}",
        f"{requests:,.0f}", f"{read:,.1f} ({megabytes:,.1f})",
        f"{p50:.0f} / {p99:.0f}" if requests else "-",
    ]  # fmt: skip


if __name__ == "__main__":
    main()
