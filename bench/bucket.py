"""Every loader that reads a bucket, from the local object server and from the local folder, side
by side: host side, images/s, and the bucket's requests/s, MB/s and GET latency.

    python bench/bucket.py                       # 6,000 synthetic images, n_workers=2, 3 pairs
    python bench/bucket.py --images 2000 --pairs 1 --loaders dataset pickle

The data set is uploaded once, and every shard loader's set with prepare.py storage=s3 (built
locally first, so the folder runs read the very same shards). `s3connector-shards` is
s3connector with loader.reads=shards. LitData's runs are two epochs: its first reads the bucket
into its chunk cache, its second the cache; both are shown.

The server (python -m facebench.storage.server's, on a free port, in a temporary folder) shares
the machine's cores with the loader: its CPU time during each bucket run is read from its
processes and stated beside the run, as cores busy over the epoch. Each loader runs once from
each place to warm up, then `pairs` times alternated (folder, bucket). Table `bucket-loaders`.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

import psutil
from common import Bench, generated_root, parser, run_python

from facebench import loaders
from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.storage import client, server
from facebench.storage.address import parse
from facebench.storage.sync import upload_tree

# Each loader as the table names it: its overrides.
BUCKET_LOADERS = {name: [f"loader={name}"] for name in loaders.names(real_only=True, storage="s3")}
BUCKET_LOADERS["s3connector-shards"] = ["loader=s3connector", "loader.reads=shards"]


def run_epochs(scratch: str, overrides: list[str]) -> list[dict[str, float]]:
    """One train.py job (MLflow off): each epoch's metrics."""
    output = Path(tempfile.mkdtemp(dir=scratch))
    run_python(["train.py", "tracking=false", *overrides, f"hydra.run.dir={output}"])
    return json.loads((output / "results.json").read_text())["epochs"]


def shard_formats(names: list[str]) -> list[str]:
    """The shard formats the named loaders (BUCKET_LOADERS' names) read, sorted."""
    found = set()
    for name in names:
        spec = loaders.get(name.split("-")[0])
        options = spec.options()
        if "loader.reads=shards" in BUCKET_LOADERS[name]:
            options.reads = "shards"
        if (shard_format := spec.format_for(options)) is not None:
            found.add(shard_format)
    return sorted(found)


def upload_shards(url: str, s3: server.Running, keys: list[str], names: list[str]) -> None:
    """prepare.py storage=s3 for each shard format the chosen loaders read (the data set's
    upload is done by then: prepare.py finds it in place)."""
    for shard_format in shard_formats(names):
        run_python(
            ["prepare.py", *s3.overrides(url, emulate=False), *keys, f"format={shard_format}"]
        )


def server_cpu_s(running: server.Running) -> float:
    """CPU seconds the server's processes (and their children) have used so far."""
    total = 0.0
    for pid in running.pids.values():
        try:
            process = psutil.Process(pid)
            for member in [process, *process.children(recursive=True)]:
                times = member.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=6000)
    arguments.add_argument("--pairs", type=int, default=3)
    arguments.add_argument("--workers", type=int, default=2)
    arguments.add_argument("--batch-size", type=int, default=100)
    arguments.add_argument("--loaders", nargs="*", default=list(BUCKET_LOADERS))
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
        url = f"s3://{server.BUCKET}/bench{args.images}"
        upload_tree(root, parse(url))
        upload_shards(url, s3, data, args.loaders)
        places = {"folder": [], "bucket": s3.overrides(url, emulate=False)}
        for name in args.loaders:
            # LitData: its first epoch (from the bucket) and its second (from its cache).
            epochs = 2 if name == "litdata" else 1
            runs: dict[str, list[list[dict[str, float]]]] = {"folder": [], "bucket": []}
            cores: list[float] = []
            # A loader that reads a bucket only (s3connector) has no folder run to compare.
            reads_folder = loaders.get(name.split("-")[0]).reads("local")
            for attempt in range(args.pairs + 1):
                for place, keys in places.items():
                    if place == "folder" and not reads_folder:
                        continue
                    before = server_cpu_s(s3)
                    overrides = [*BUCKET_LOADERS[name], *common, *keys, f"epochs={epochs}"]
                    measured = run_epochs(scratch, overrides)
                    if place == "bucket":  # over the first epoch: the one that reads the bucket
                        used = (server_cpu_s(s3) - before) / measured[0]["epoch_time_s"]
                    if attempt == 0:
                        continue  # the warm-up run
                    runs[place].append(measured)
                    if place == "bucket":
                        cores.append(used)
            rows.append(_row(name, runs, cores, 0))
            if epochs == 2:
                rows.append(_row(f"{name}, 2nd epoch (its cache)", runs, cores, 1))
    header = [
        "loader", "folder images/s", "bucket images/s", "bucket / folder", "requests/s",
        "MB/s", "GET p50 / p99 ms", "server CPU, cores",
    ]  # fmt: skip
    details = (
        f"{args.images:,} synthetic images, `model=none host_only=true n_workers={args.workers} "
        f"batch_size={args.batch_size}`, each loader once from each place to warm up, then "
        f"{args.pairs} pairs alternated (folder, bucket); medians; shard loaders read the set "
        "prepare.py storage=s3 uploaded (the folder runs the same set, built locally); the "
        "local object server (Swift with s3api, memcached) on the same two cores; server CPU over "
        "the first epoch; nothing else ran"
    )
    body = markdown(header, rows)
    bench.publish("bucket-loaders", bench.section("Loaders reading a bucket", details, body))


def _row(
    name: str, runs: dict[str, list[list[dict[str, float]]]], cores: list[float], epoch: int
) -> list[str]:
    def median(place: str, key: str) -> float:
        return statistics.median(run[epoch].get(key, 0.0) for run in runs[place])

    folder = median("folder", "images_per_s") if runs["folder"] else None
    bucket = median("bucket", "images_per_s")
    requests = median("bucket", "storage_requests_per_s")
    megabytes = median("bucket", "storage_mb_per_s")
    p50, p99 = median("bucket", "storage_get_p50_ms"), median("bucket", "storage_get_p99_ms")
    return [
        name, "-" if folder is None else f"{folder:,.0f}", f"{bucket:,.0f}",
        "-" if folder is None else f"{bucket / folder:.2f}", f"{requests:,.0f}",
        f"{megabytes:.1f}", f"{p50:.1f} / {p99:.1f}" if requests else "-",
        f"{statistics.median(cores):.2f}" if epoch == 0 else "-",
    ]  # fmt: skip


if __name__ == "__main__":
    main()
