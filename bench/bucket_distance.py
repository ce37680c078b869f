"""Loaders reading a bucket at an emulated distance, measured against the bounds the distance
sets: per-image loaders as the latency grows, shard loaders at two bandwidths, each run from the
emulated bucket's copy (storage.answers=copy, the default) and relayed to the server
(storage.answers=endpoint) side by side; the checks the emulation is held to; and the
article's three pipelines from emulated S3 Standard.

    python bench/bucket_distance.py                          # every table
    python bench/bucket_distance.py --only latency --loaders dataset spdl

The local object server (on a free port, in a temporary folder) holds the synthetic set and every
shard loader's set (prepare.py storage=s3); each job runs the relay (facebench/storage/relay.py)
in front of it. Latency 0 is the server as it answers (storage.emulate=false: no relay).

- `latency`: the per-image loaders at 0, 1, 5, 20 and 50 ms (storage=custom: a constant
  latency, nothing else), host side: images/s, the requests in flight (Little's law), the
  clients' mean GET against the emulated latency, the share answered late, the distance's bound
  and the rate's share of it, the client's CPU per GET, what held the run.
- `shards`: the shard loaders at 20 ms with 100 and 700 Mbit/s a connection: images/s against
  the distance's bound (latency plus a shard's transfer).
- `checks`: dataset with 4 workers at 20 ms from the copy (its late share, its clients' mean
  first byte against the emulated one), and at 1 ms from the copy against the server read
  directly (images/s), alternated three times.
- `article`: `experiment=article`'s loaders and workers (dataset, datapipe, pickle x 5, 10),
  storage=s3 (S3 Standard's profile, tail included), accelerator=custom at the article's own
  epoch rate.
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

LATENCIES_MS = (0, 1, 5, 20, 50)
PER_IMAGE = ("dataset", "nodes", "s3connector", "spdl")
SHARD_LOADERS = ("pickle", "webdataset", "litdata", "s3connector-shards")
BANDWIDTHS_MBPS = (100, 700)
ANSWERS = ("copy", "endpoint")
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
    """What held the run (storage_held_by), its storage limit, or its costliest stage; an
    emulated accelerator kept fed sets the pace itself."""
    if results["metrics"].get("au_pass"):
        return "nothing: the accelerator was fed"
    tags = results.get("tags", {})
    return (
        tags.get("storage_limit") or tags.get("storage_held_by") or tags.get("dominant_stage")
        or "-"
    )  # fmt: skip


def distance_row(name: str, latency: str, answers: str, results: dict) -> list[str]:
    """A row of measured against bound: images/s, in flight, GET mean against the emulated
    latency, late share, the distance's bound and the rate's share of it, client CPU."""
    m = results["metrics"]
    rate = m.get("steady_images_per_s", m["images_per_s"])
    said = f"{rate:,.0f}"
    if m.get("storage_beyond_bounds"):  # its steady window held none of its reads
        said = f"{m['images_per_s']:,.0f} (the epoch's; steady {rate:,.0f}: beyond its bound)"
        rate = m["images_per_s"]
    in_flight = m.get("storage_requests_per_s", 0) * m.get("storage_get_mean_ms", 0) / 1000
    bound = m.get("storage_bound_distance_images_per_s", 0.0)
    emulated = m.get("storage_emulated_mean_ms")
    return [
        name, latency, answers, said, f"{in_flight:,.1f}",
        f"{m.get('storage_get_mean_ms', 0):,.1f}",
        f"{emulated:,.1f}" if emulated is not None else "-",
        f"{m['storage_relay_late_frac']:.0%}" if "storage_relay_late_frac" in m else "-",
        f"{bound:,.0f} ({rate / bound:.0%})" if bound else "-",
        f"{m.get('storage_client_ms_per_get', 0):.2f}", held_back(results),
    ]  # fmt: skip


DISTANCE_HEADER = [
    "loader", "latency ms", "answered from", "host-side images/s", "in flight (Little)",
    "GET mean ms", "emulated mean ms", "late", "distance bound images/s (rate's share)",
    "client CPU ms a GET", "held by",
]  # fmt: skip


def distance_keys(s3: server.Running, url: str, latency: float, answers: str) -> list[str]:
    """A job's storage keys: the server itself (latency 0), or a constant latency answered by
    the relay's copy or relayed to the server."""
    if latency == 0:
        return s3.overrides(url, emulate=False)
    return [*s3.overrides(url, profile="custom"), f"storage.latency_ms={latency:g}",
            f"storage.answers={answers}"]  # fmt: skip


def latency_table(scratch: str, s3: server.Running, url: str, common: list[str], names: list[str]):
    rows = []
    for name in names:
        for latency in LATENCIES_MS:
            for answers in ANSWERS if latency else ("server",):
                keys = [*BUCKET_LOADERS[name], *common, *distance_keys(s3, url, latency, answers)]
                host = run_job(scratch, [*keys, "model=none", "host_only=true"])
                rows.append(distance_row(name, str(latency), answers, host))
    return markdown(DISTANCE_HEADER, rows)


def shard_table(scratch: str, s3: server.Running, url: str, common: list[str], names: list[str]):
    rows = []
    for name in names:
        for mbps in BANDWIDTHS_MBPS:
            for answers in ANSWERS:
                keys = [*BUCKET_LOADERS[name], *common, *distance_keys(s3, url, 20, answers),
                        f"storage.bandwidth_mbps={mbps}"]  # fmt: skip
                host = run_job(scratch, [*keys, "model=none", "host_only=true"])
                rows.append(distance_row(name, f"20, {mbps} Mbit/s", answers, host))
    return markdown(DISTANCE_HEADER, rows)


def checks_table(scratch: str, s3: server.Running, url: str, common: list[str]):
    """The emulation's checks, side by side, three rounds alternated."""
    base = [*BUCKET_LOADERS["dataset"], *common, "n_workers=4", "model=none", "host_only=true"]
    late, first, ratios = [], [], []
    for _ in range(3):
        at20 = run_job(scratch, [*base, *distance_keys(s3, url, 20, "copy")])["metrics"]
        late.append(at20["storage_relay_late_frac"])
        first.append(at20["storage_ttfb_mean_ms"] / at20["storage_emulated_mean_ms"])
        at1 = run_job(scratch, [*base, *distance_keys(s3, url, 1, "copy")])["metrics"]
        direct = run_job(scratch, [*base, *distance_keys(s3, url, 0, "server")])["metrics"]
        ratios.append(at1["images_per_s"] / direct["images_per_s"])
    rows = [
        ["late share at 20 ms, 4 workers, from the copy", "<= 5%",
         " / ".join(f"{value:.1%}" for value in late)],
        ["clients' mean first byte / emulated mean, same runs", "within 10% of 1",
         " / ".join(f"{value:.3f}" for value in first)],
        ["images/s at 1 ms from the copy / the server read directly", ">= 1.5",
         " / ".join(f"{value:.2f}" for value in ratios)],
    ]  # fmt: skip
    return markdown(["check", "held to", "three rounds"], rows)


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
    names = [name for name in args.loaders if name in PER_IMAGE]
    body = latency_table(scratch, s3, url, common, names)
    details = (
        f"{where}; `storage=custom storage.latency_ms=<ms> storage.answers=copy|endpoint` (0: "
        f"`storage.emulate=false`), `n_workers={args.workers} batch_size={args.batch_size} "
        "model=none host_only=true`; in flight: requests/s x the clients' mean GET; late: the "
        "share of first bytes that left after their emulated time (the server's answer, or the "
        "relay's CPU); bound: those requests in flight over the emulated latency"
    )
    section = bench.section("Loaders at an emulated distance, against its bounds", details, body)
    bench.publish("distance-loaders", section)


def publish_shards(bench: Bench, scratch: str, s3: server.Running, url: str, where: str) -> None:
    args = bench.args
    common = [f"data.n_images={args.images}", f"batch_size={args.batch_size}",
              f"n_workers={args.workers}"]  # fmt: skip
    names = [name for name in args.loaders if name in SHARD_LOADERS]
    body = shard_table(scratch, s3, url, common, names)
    details = (
        f"{where}; `storage=custom storage.latency_ms=20 storage.bandwidth_mbps=<Mbit/s> "
        f"storage.answers=copy|endpoint n_workers={args.workers} batch_size={args.batch_size} "
        "model=none host_only=true`, each set uploaded by prepare.py storage=s3; bound: the "
        "requests in flight over (the latency + a shard's transfer at the bandwidth)"
    )
    section = bench.section("Shard loaders at 20 ms and two bandwidths", details, body)
    bench.publish("distance-shard-sizes", section)


def publish_checks(bench: Bench, scratch: str, s3: server.Running, url: str, where: str) -> None:
    args = bench.args
    common = [f"data.n_images={args.images}", f"batch_size={args.batch_size}"]
    body = checks_table(scratch, s3, url, common)
    details = (
        f"{where}; loader=dataset n_workers=4 batch_size={args.batch_size} model=none "
        "host_only=true: at 20 ms from the copy, then at 1 ms from the copy, then the server "
        "read directly (`storage.emulate=false`), in turn, three rounds"
    )
    section = bench.section("The emulated bucket's checks", details, body)
    bench.publish("distance-checks", section)


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
    arguments.add_argument("--images", type=int, default=3000)
    arguments.add_argument("--workers", type=int, default=4)
    arguments.add_argument("--batch-size", type=int, default=50)
    arguments.add_argument("--article-images", type=int, default=12000)
    arguments.add_argument("--loaders", nargs="*", default=[*PER_IMAGE, *SHARD_LOADERS])
    arguments.add_argument(
        "--only", nargs="*", default=["latency", "shards", "checks", "article"],
        choices=["latency", "shards", "checks", "article"],
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
        for shard_format in shard_formats([n for n in args.loaders if n in SHARD_LOADERS]):
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
            "checks": publish_checks,
            "article": publish_article,
        }
        for name in args.only:
            sections[name](bench, scratch, s3, url, where)


if __name__ == "__main__":
    main()
