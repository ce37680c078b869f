"""The S3 client libraries side by side: each per-image loader reading the emulated bucket
through each client (storage.client), at two latencies, with GETs a second per process, the
client's CPU per GET and per MB, the images a second, what an epoch of the whole article set
would cost, and what held each run.

    python bench/clients.py                                   # the table, into docs/benchmarks.md
    python bench/clients.py --clients crt obstore --loaders dataset --latencies 20

The local object server (on a free port, in a temporary folder) holds the synthetic set; each
job runs the emulated bucket's relay in front of it, answering from its copy
(storage=custom storage.latency_ms=<ms>: a constant latency, nothing else). Jobs are host side
(model=none host_only=true), and the clients take turns within each loader and latency, so
that drift on the machine falls on all of them alike.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bucket_distance import held_back, run_job
from common import Bench, generated_root, parser

from facebench.config.choices import S3Client
from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.storage import client, clients, server
from facebench.storage.address import parse
from facebench.storage.sync import upload_tree

LOADERS = ("dataset", "nodes", "datapipe", "spdl")
LATENCIES_MS = (1, 20)
ARTICLE_IMAGES = 922_599  # the cost column prices an epoch of the article's whole set

HEADER = [
    "loader", "latency ms", "client", "host-side images/s", "GETs/s a process",
    "client CPU ms a GET", "client CPU ms a MB", "GET mean ms", "late",
    "GETs of an epoch of 922,599 (S3 Standard)", "held by",
]  # fmt: skip


def row(name: str, latency: int, which: str, results: dict) -> list[str]:
    m = results["metrics"]
    rate = m.get("steady_images_per_s", m["images_per_s"])
    per_image = m.get("storage_requests", 0) / max(1.0, m.get("samples_seen", 1))
    gets = ARTICLE_IMAGES * per_image
    return [
        name, str(latency), which, f"{rate:,.0f}",
        f"{m.get('storage_gets_per_s_per_process', 0):,.0f}",
        f"{m.get('storage_client_ms_per_get', 0):.2f}",
        f"{m.get('storage_client_ms_per_mb', 0):.1f}",
        f"{m.get('storage_get_mean_ms', 0):.1f}",
        f"{m['storage_relay_late_frac']:.0%}" if "storage_relay_late_frac" in m else "-",
        f"{gets:,.0f} (${gets / 1000 * 0.0004:,.2f})", held_back(results),
    ]  # fmt: skip


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=3000)
    arguments.add_argument("--workers", type=int, default=4)
    arguments.add_argument("--batch-size", type=int, default=50)
    arguments.add_argument("--loaders", nargs="*", default=list(LOADERS))
    arguments.add_argument("--latencies", nargs="*", type=int, default=list(LATENCIES_MS))
    installed = [c.value for c in S3Client if clients.module(c.value).REQUIREMENT.available()]
    arguments.add_argument("--clients", nargs="*", default=installed)
    bench = Bench.start(arguments)
    args = bench.args
    ensure_synthetic(cache_dir(""), args.images, 0, n_procs=2)
    common = [f"data.n_images={args.images}", f"batch_size={args.batch_size}",
              f"n_workers={args.workers}", "model=none", "host_only=true"]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as scratch, server.local_server(Path(scratch) / "s3") as s3:
        os.environ.update(s3.environment())
        client.configure(client.Endpoint(s3.endpoint, server.REGION, True))
        url = f"s3://{server.BUCKET}/bench{args.images}"
        upload_tree(generated_root(args.images), parse(url))
        # The relay's copy of the set taken once, before any timed job.
        warm_up = [*s3.overrides(url, profile="custom"), "storage.latency_ms=1", "max_batches=2"]
        run_job(scratch, [*warm_up, *common])
        for name in args.loaders:
            for latency in args.latencies:
                for which in args.clients:
                    keys = [*s3.overrides(url, profile="custom"), f"storage.latency_ms={latency}",
                            f"storage.client={which}"]  # fmt: skip
                    results = run_job(scratch, [f"loader={name}", *keys, *common])
                    rows.append(row(name, latency, which, results))
    details = (
        f"{args.images:,} synthetic images in the local object server (Swift with s3api, "
        "memcached) on the same two cores, the relay answering from its copy; each job once, "
        "the clients in turn within each loader and latency; nothing else ran; "
        "`storage=custom storage.latency_ms=<ms> storage.client=<client> "
        f"n_workers={args.workers} batch_size={args.batch_size} model=none host_only=true`; "
        "client CPU: the read stage's CPU time and the workers' CPU outside every stage, per "
        "GET; the last column prices only the GETs, at S3 Standard's $0.0004 a thousand"
    )
    section = bench.section("S3 clients, per loader, at two latencies", details,
                            markdown(HEADER, rows))  # fmt: skip
    bench.publish("s3-clients", section)


if __name__ == "__main__":
    main()
