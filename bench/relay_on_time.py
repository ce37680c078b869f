"""The emulated bucket on time: the relay under real-time scheduling (storage.realtime=true, the
default) against the fair scheduler's turns (false), side by side, alternated.

    python bench/relay_on_time.py                       # both tables
    python bench/relay_on_time.py --only near --rounds 3

- `busy`: loader=dataset with 4 workers from the bucket's copy at a constant 20 ms, on a quiet
  host and with both cores held by two busy processes (another job beside the run, as on any
  shared machine): the relay's late share, its mean first byte against the emulated 20 ms, the
  clients' median GET, images/s.
- `near`: on a quiet host, the buckets where the relay's own time weighs most: S3 Express One
  Zone's profile (5 ms median, 9 ms p99), a constant 1 ms and a constant 20 ms: the relay's mean
  first byte against the emulated mean, and where a request's time went before it left (ready:
  parsed, its signature checked, framed from the copy; behind: how long after its due time its
  first byte left).

The local object server (on a free port, in a temporary folder) holds the synthetic set; each job
runs the relay in front of it, answering from its copy (storage.answers=copy).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from common import Bench, busy_cores, generated_root, parser, run_train

from facebench.data.synthetic import ensure_synthetic
from facebench.host.paths import cache_dir
from facebench.report.tables import markdown
from facebench.storage import client, server
from facebench.storage.address import parse
from facebench.storage.sync import upload_tree

SCHEDULERS = {"real-time": "storage.realtime=true", "fair": "storage.realtime=false"}
NEAR = {  # what is emulated: its storage profile, and its keys beyond the profile's
    "S3 Express One Zone (5 ms, p99 9 ms)": ("s3-express", []),
    "constant 1 ms": ("custom", ["storage.latency_ms=1"]),
    "constant 20 ms": ("custom", ["storage.latency_ms=20"]),
}


def busy_table(scratch: str, s3: server.Running, url: str, args) -> str:
    base = [
        "loader=dataset", "n_workers=4", f"batch_size={args.batch_size}", "model=none",
        "host_only=true", *s3.overrides(url, profile="custom"), "storage.latency_ms=20",
    ]  # fmt: skip
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for load in ("quiet", "both cores busy"):
            for name, key in SCHEDULERS.items():
                with busy_cores(0 if load == "quiet" else 2):
                    metrics = checked(name, run_train(scratch, [*base, key]))
                runs.setdefault((load, name), []).append(metrics)
    rows = _rows(runs, [
        ("storage_relay_late_frac", "{:.3f}"), ("storage_relay_ttfb_mean_ms", "{:.1f}"),
        ("storage_get_p50_ms", "{:.1f}"), ("images_per_s", "{:,.0f}"),
    ])  # fmt: skip
    header = ["host", "relay", "late share", "relay's mean first byte, ms",
              "clients' GET p50, ms", "images/s"]  # fmt: skip
    return markdown(header, rows)


def near_table(scratch: str, s3: server.Running, url: str, args) -> str:
    base = [
        "loader=dataset", "n_workers=4", f"batch_size={args.batch_size}", "model=none",
        "host_only=true",
    ]  # fmt: skip
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for name in NEAR:
            for scheduler, key in SCHEDULERS.items():
                profile, keys = NEAR[name]
                overrides = [*base, *s3.overrides(url, profile=profile), *keys, key]
                metrics = checked(scheduler, run_train(scratch, overrides))
                runs.setdefault((name, scheduler), []).append(metrics)
    rows = _rows(runs, [
        ("storage_emulated_mean_ms", "{:.2f}"), ("storage_relay_ttfb_mean_ms", "{:.2f}"),
        ("storage_relay_ready_mean_ms", "{:.2f}"), ("storage_relay_behind_mean_ms", "{:.2f}"),
        ("storage_relay_late_frac", "{:.3f}"),
    ])  # fmt: skip
    header = ["emulated", "relay", "emulated mean, ms", "relay's mean first byte, ms",
              "ready, ms", "behind, ms", "late share"]  # fmt: skip
    return markdown(header, rows)


def checked(scheduler: str, metrics: dict) -> dict:
    """A run's metrics, once its relay is known to have run under the scheduler its column
    names: unprivileged, the real-time column would hold fair runs."""
    if scheduler == "real-time" and not metrics.get("storage_relay_realtime"):
        raise SystemExit(
            "the relay was not allowed real-time scheduling here: run as root, with "
            "CAP_SYS_NICE, or after ulimit -r 10"
        )
    return metrics


def _rows(
    runs: dict[tuple[str, str], list[dict]], columns: list[tuple[str, str]]
) -> list[list[str]]:
    """A row per case (its two labels), then per metric every round's value in order, as
    `form` writes it: '0.012 / 0.004'."""
    return [
        [*labels, *(" / ".join(form.format(run[name]) if name in run else "-" for run in found)
                    for name, form in columns)]
        for labels, found in runs.items()
    ]  # fmt: skip


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=3000)
    arguments.add_argument("--near-images", type=int, default=1200)
    arguments.add_argument("--batch-size", type=int, default=50)
    arguments.add_argument("--rounds", type=int, default=2)
    arguments.add_argument("--only", nargs="*", default=["busy", "near"], choices=["busy", "near"])
    bench = Bench.start(arguments)
    args = bench.args
    sizes = {"busy": args.images, "near": args.near_images}
    with tempfile.TemporaryDirectory() as scratch, server.local_server(Path(scratch) / "s3") as s3:
        os.environ.update(s3.environment())
        client.configure(client.Endpoint(s3.endpoint, server.REGION, True))
        urls = {}
        for table in args.only:  # each table's set: a bucket's data is all its prefix holds
            ensure_synthetic(cache_dir(""), sizes[table], 0, n_procs=2)
            urls[table] = f"s3://{server.BUCKET}/bench{sizes[table]}"
            upload_tree(generated_root(sizes[table]), parse(urls[table]))
        where = (
            f"the local object server (Swift with s3api, memcached) on the same two cores, the "
            f"relay in front of it answering from its copy; `loader=dataset n_workers=4 "
            f"batch_size={args.batch_size} model=none host_only=true`; {args.rounds} rounds, "
            "the schedulers alternated within each"
        )
        if "busy" in args.only:
            body = busy_table(scratch, s3, urls["busy"], args)
            details = (
                f"{where}; {args.images:,} images, a constant 20 ms; busy: two processes "
                "spinning beside the run, nothing else ran"
            )
            title = "The relay on a busy host: real-time against fair scheduling"
            bench.publish("relay-busy", bench.section(title, details, body))
        if "near" in args.only:
            body = near_table(scratch, s3, urls["near"], args)
            details = f"{where}; {args.near_images:,} images; nothing else ran"
            title = "The relay at near distances: where a request's time goes"
            bench.publish("relay-near", bench.section(title, details, body))


if __name__ == "__main__":
    main()
