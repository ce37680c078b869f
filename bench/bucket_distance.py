"""Loaders reading a bucket at an emulated distance: what each one delivers as the latency grows,
the shard size that keeps the shard loaders fed at 20 ms, and the article's three pipelines from
emulated S3 Standard with an emulated 2080 Ti-class accelerator.

    python bench/bucket_distance.py                          # all three tables
    python bench/bucket_distance.py --only latency --loaders dataset pickle

The local object server (on a free port, in a temporary folder) holds the synthetic set and every
shard loader's set (prepare.py storage=s3); each job runs the relay (facebench/storage/relay.py)
in front of it. Latency 0 is the server as it answers (storage.emulate=false: no relay).

- `latency`: each loader at 0, 5, 20 and 50 ms (storage=custom: latency only), n_workers 2, host
  side (images/s, requests/s) and then with one emulated a100 (its AU), each job once, the
  latencies of a loader one after the other. The relay's CPU (a share of its one core) and the
  share of requests the server answered after the emulated latency are stated.
- `shards`: the shard loaders at 20 ms with one emulated a100, at three shard sizes.
- `article`: `experiment=article`'s loaders and workers (dataset, datapipe, pickle x 5, 10),
  storage=s3 (S3 Standard's profile), accelerator=custom at the article's own epoch rate.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from bucket import BUCKET_LOADERS, shard_formats
from common import Bench, generated_root, parser, run_python

from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.storage import client, server
from facebench.storage.address import parse
from facebench.storage.sync import upload_tree

LATENCIES_MS = (0, 5, 20, 50)
# prepare.py cuts a set so that up to 16 workers get a shard each: 4,000 images allow up to 250.
SHARD_SIZES = (50, 100, 250)
SHARD_BATCH = 50  # the shard sizes' batch: each size a whole number of batches
SHARD_LOADERS = ("pickle", "webdataset", "litdata", "s3connector-shards")
# The article's table: 922,599 images in 758 s with its pickle shards and 5 or 10 workers, its
# fastest pipeline, on one RTX 2080 Ti: 1,217 images/s, the rate its GPU trained at (or more).
ARTICLE_RATE = 922_599 / 758
ARTICLE_S = {  # its epoch times, s: (loader, n_workers) -> seconds
    ("dataset", 5): 10034, ("dataset", 10): 3581, ("datapipe", 5): 2993,
    ("datapipe", 10): 7986, ("pickle", 5): 760, ("pickle", 10): 758,
}  # fmt: skip


def run_job(scratch: str, overrides: list[str]) -> dict:
    """One train.py job (MLflow off): its results.json."""
    output = Path(tempfile.mkdtemp(dir=scratch))
    run_python(["train.py", "tracking=false", *overrides, f"hydra.run.dir={output}"])
    return json.loads((output / "results.json").read_text())


def held_back(results: dict) -> str:
    """The run's storage limit, or its costliest stage; an emulated accelerator kept fed sets
    the pace itself."""
    if results["metrics"].get("au_pass"):
        return "nothing: the accelerator was fed"
    tags = results.get("tags", {})
    return tags.get("storage_limit") or tags.get("dominant_stage") or "-"


def latency_table(scratch: str, s3: server.Running, url: str, common: list[str], names: list[str]):
    rows = []
    for name in names:
        for latency in LATENCIES_MS:
            distance = (
                s3.overrides(url, emulate=False)
                if latency == 0
                else [*s3.overrides(url, profile="custom"), f"storage.latency_ms={latency}"]
            )
            keys = [*BUCKET_LOADERS[name], *common, *distance]
            host = run_job(scratch, [*keys, "model=none", "host_only=true"])
            fed = run_job(scratch, [*keys, "accelerator=a100"])
            metrics = host["metrics"]
            rate = metrics.get("steady_images_per_s", metrics["images_per_s"])
            relay = (
                f"{metrics['storage_relay_cpu_frac']:.2f} / "
                f"{metrics['storage_relay_late_frac']:.0%}"
                if "storage_relay_cpu_frac" in metrics
                else "-"
            )
            rows.append(
                [
                    name, f"{latency}", f"{rate:,.0f}",
                    f"{metrics.get('storage_requests_per_s', 0):,.0f}",
                    f"{metrics.get('storage_get_p50_ms', 0):,.1f}",
                    f"{fed['metrics']['au']:.0%}", held_back(host), relay,
                ]
            )  # fmt: skip
    header = [
        "loader", "latency ms", "host-side images/s", "requests/s", "GET p50 ms",
        "AU, one a100", "held back by (host side)", "relay CPU / answered late",
    ]  # fmt: skip
    return markdown(header, rows)


def shard_table(scratch: str, s3: server.Running, url: str, common: list[str]):
    rows = []
    for size in SHARD_SIZES:
        for shard_format in shard_formats(list(SHARD_LOADERS)):
            run_python(
                ["prepare.py", *s3.overrides(url, emulate=False), *common,
                 f"format={shard_format}", f"shard_size={size}"]
            )  # fmt: skip
        for name in SHARD_LOADERS:
            keys = [*BUCKET_LOADERS[name], *common, f"shard_size={size}"]
            fed = run_job(
                scratch,
                [*keys, *s3.overrides(url, profile="custom"), "storage.latency_ms=20",
                 "accelerator=a100"],
            )  # fmt: skip
            metrics = fed["metrics"]
            rows.append(
                [
                    name, f"{size}", f"{fed['metrics']['au']:.0%}",
                    f"{metrics.get('steady_images_per_s', metrics['images_per_s']):,.0f}",
                    f"{metrics.get('storage_requests', 0):,.0f}",
                    f"{metrics.get('storage_get_p50_ms', 0):,.0f}", held_back(fed),
                ]
            )  # fmt: skip
    header = [
        "loader", "shard size", "AU, one a100", "images/s", "requests",
        "GET p50 ms", "held back by",
    ]  # fmt: skip
    return markdown(header, rows)


def article_table(scratch: str, s3: server.Running, url: str, data: list[str]):
    rows = []
    for (name, workers), article_s in ARTICLE_S.items():
        if name == "pickle":  # its set cut for this many workers, each reading its own shards
            run_python(
                ["prepare.py", *s3.overrides(url, emulate=False), *data, "batch_size=600",
                 "format=pickle", f"n_workers={workers}"]
            )  # fmt: skip
        results = run_job(
            scratch,
            [f"loader={name}", f"n_workers={workers}", "batch_size=600", *data,
             *s3.overrides(url), "accelerator=custom",
             f"accelerator.images_per_s={ARTICLE_RATE:.0f}"],
        )  # fmt: skip
        metrics = results["metrics"]
        article_rate = 922_599 / article_s
        rows.append(
            [
                name, f"{workers}", f"{article_s:,}", f"{article_rate:,.0f}",
                f"{metrics['images_per_s']:,.0f}", f"{metrics['au']:.0%}",
                f"{metrics.get('storage_requests_per_s', 0):,.0f}",
                f"{metrics.get('storage_get_p50_ms', 0):,.0f}", held_back(results),
            ]
        )  # fmt: skip
    header = [
        "pipeline", "n_workers", "article's epoch s", "article's images/s",
        "here images/s", "AU", "requests/s", "GET p50 ms", "held back by",
    ]  # fmt: skip
    return markdown(header, rows)


def publish_latency(bench: Bench, scratch: str, s3: server.Running, url: str, where: str) -> None:
    args = bench.args
    common = [f"data.n_images={args.images}", f"batch_size={args.batch_size}",
              f"n_workers={args.workers}"]  # fmt: skip
    body = latency_table(scratch, s3, url, common, args.loaders)
    details = (
        f"{where}; `storage=custom storage.latency_ms=<ms>` (0: `storage.emulate=false`), "
        f"`n_workers={args.workers} batch_size={args.batch_size}`; host side "
        "(`model=none host_only=true`), then `accelerator=a100` for AU; relay CPU: its "
        "CPU time over its life, a share of its one core; answered late: the share of "
        "requests the server answered after the emulated latency"
    )
    section = bench.section("Loaders at an emulated distance", details, body)
    bench.publish("distance-loaders", section)


def publish_shards(bench: Bench, scratch: str, s3: server.Running, url: str, where: str) -> None:
    args = bench.args
    shards_common = [f"data.n_images={args.images}", f"batch_size={SHARD_BATCH}",
                     f"n_workers={args.workers}"]  # fmt: skip
    body = shard_table(scratch, s3, url, shards_common)
    details = (
        f"{where}; `storage=custom storage.latency_ms=20 accelerator=a100 "
        f"n_workers={args.workers} batch_size={SHARD_BATCH} shard_size=<size>`, each "
        "set uploaded by prepare.py storage=s3 at that size"
    )
    section = bench.section("Shard sizes at 20 ms", details, body)
    bench.publish("distance-shard-sizes", section)


def publish_article(bench: Bench, scratch: str, s3: server.Running, url: str, where: str) -> None:
    args = bench.args
    # More images: with 10 workers and batches of 600, each worker gets two batches.
    ensure_synthetic(cache_dir(""), args.article_images, 0, n_procs=2)
    article_url = f"s3://{server.BUCKET}/bench{args.article_images}"
    upload_tree(generated_root(args.article_images), parse(article_url))
    article_data = [f"data.n_images={args.article_images}"]
    body = article_table(scratch, s3, article_url, article_data)
    there = where.replace(f"{args.images:,}", f"{args.article_images:,}")
    details = (
        f"{there}; `storage=s3` (S3 Standard's profile: 20 ms, 700 Mbit/s a connection, "
        "5,500 requests/s) `accelerator=custom accelerator.images_per_s="
        f"{ARTICLE_RATE:.0f}` (the article's own fastest epoch, 922,599 images in 758 s "
        "on its RTX 2080 Ti) `batch_size=600`; images/s: the whole epoch, start-up "
        "included, as the article timed it"
    )
    section = bench.section("The article's pipelines from emulated S3", details, body)
    bench.publish("article-s3", section)


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=6000)
    arguments.add_argument("--workers", type=int, default=2)
    arguments.add_argument("--batch-size", type=int, default=100)
    arguments.add_argument("--article-images", type=int, default=12000)
    arguments.add_argument("--loaders", nargs="*", default=list(BUCKET_LOADERS))
    arguments.add_argument(
        "--only", nargs="*", default=["latency", "shards", "article"],
        choices=["latency", "shards", "article"],
    )  # fmt: skip
    bench = Bench.start(arguments)
    args = bench.args
    ensure_synthetic(cache_dir(""), args.images, 0, n_procs=2)
    root = generated_root(args.images)
    data = [f"data.n_images={args.images}"]
    common = [*data, f"batch_size={args.batch_size}", f"n_workers={args.workers}"]
    with tempfile.TemporaryDirectory() as scratch, server.local_server(Path(scratch) / "s3") as s3:
        os.environ.update(s3.environment())
        client.configure(client.Endpoint(s3.endpoint, server.REGION, True))
        url = f"s3://{server.BUCKET}/bench{args.images}"
        upload_tree(root, parse(url))
        for shard_format in shard_formats(args.loaders):
            run_python(
                ["prepare.py", *s3.overrides(url, emulate=False), *common, f"format={shard_format}"]
            )
        where = (
            f"{args.images:,} synthetic images in the local object server (Swift with s3api, "
            "memcached) on the same two cores, the relay in front of it; each job once; "
            "nothing else ran"
        )
        sections = {
            "latency": publish_latency,
            "shards": publish_shards,
            "article": publish_article,
        }
        for name in args.only:
            sections[name](bench, scratch, s3, url, where)


if __name__ == "__main__":
    main()
