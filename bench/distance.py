"""What the distance relay costs: the requests a second it relays on one core, and how close
each limit comes to its setting.

    python bench/distance.py                 # 3,000 GETs of 20 kB objects, 16 in flight
    python bench/distance.py --gets 1000

The local object server (python -m facebench.storage.server's, on a free port, in a temporary
folder) and the relay (facebench/storage/distance.py) run on this machine's cores beside the
client. Rows: GETs straight to the server; through the relay with no limit (its CPU per GET, so
its ceiling on one core); through it at 20 ms latency (the first byte against the setting); at
40 Mbit/s a connection (one 2 MB read against the setting); at 100 requests/s (the rate that
got through, and the 503s). Table `distance-relay`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
from common import Bench, parser

from facebench.report.tables import markdown
from facebench.storage import client, objects, server
from facebench.storage.distance import emulated

BUCKET = f"s3://{server.BUCKET}/relay-bench"


def keys(s3: server.Running, **distance: float) -> SimpleNamespace:
    limits = {"latency_ms": 0.0, "bandwidth_mbps": 0.0, "total_mbps": 0.0, "requests_per_s": 0.0}
    return SimpleNamespace(
        name="s3", url=BUCKET, endpoint=s3.endpoint, region=server.REGION, path_style=True,
        profile="", requests_per_worker=16, attempts=5, **{**limits, **distance},
    )  # fmt: skip


def relay_cpu_s() -> float:
    """CPU seconds of this machine's relay processes so far."""
    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        if "facebench.storage.distance" in " ".join(process.info["cmdline"] or []):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def gets(urls: list[str]) -> tuple[float, list[client.Reply]]:
    started = time.perf_counter()
    replies = client.get_many(urls)
    return time.perf_counter() - started, replies


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--gets", type=int, default=3000)
    bench = Bench.start(arguments)
    n = bench.args.gets
    rows = []
    with tempfile.TemporaryDirectory() as scratch, server.local_server(Path(scratch) / "s3") as s3:
        os.environ.update(s3.environment())
        client.configure(client.Endpoint.of(keys(s3)))
        objects.put_bytes(f"{BUCKET}/small", os.urandom(20_000), {"facebench": "1"})
        objects.put_bytes(f"{BUCKET}/large", os.urandom(2_000_000), {"facebench": "1"})
        urls = [f"{BUCKET}/small"] * n
        seconds, _ = gets(urls)
        rows.append(["straight to the server", f"{n / seconds:,.0f} GET/s", "-", "-"])
        for label, distance in [
            ("relay, no limit", {}),
            ("relay, latency 20 ms", {"latency_ms": 20.0}),
            ("relay, 40 Mbit/s a connection", {"bandwidth_mbps": 40.0}),
            ("relay, 100 requests/s", {"requests_per_s": 100.0}),
        ]:
            setting = keys(s3, **distance)
            with emulated(setting, Path(scratch)) as via:
                client.configure(client.Endpoint.of(setting, via))
                before = relay_cpu_s()
                if "bandwidth_mbps" in distance:
                    seconds, replies = gets([f"{BUCKET}/large"])
                    got = f"{2_000_000 * 8 / 1e6 / seconds:.1f} Mbit/s"
                else:
                    count = n if not distance else min(n, 1000)
                    seconds, replies = gets(urls[:count])
                    got = f"{count / seconds:,.0f} GET/s"
                cpu = relay_cpu_s() - before
                first = statistics.median(reply.first_byte_ns / 1e6 for reply in replies)
                throttled = sum(reply.throttled for reply in replies)
                per_get = cpu / len(replies) * 1e3
                rows.append([
                    label, got, f"{first:.1f} ms first byte (median)"
                    + (f", {throttled} 503s retried" if throttled else ""),
                    f"{per_get:.2f} ms ({1e3 / per_get:,.0f} GET/s a core)" if cpu else "-",
                ])  # fmt: skip
    header = ["path", "rate", "what the client saw", "relay CPU per GET"]
    details = (
        f"{n:,} GETs of a 20 kB object ({min(n, 1000):,} for the limited rows) from one process, "
        "16 in flight (CRT client); one GET of 2 MB for the bandwidth row; the local server, the "
        "relay and the client on the same two cores; nothing else ran"
    )
    body = markdown(header, rows)
    bench.publish("distance-relay", bench.section("The distance relay's cost", details, body))


if __name__ == "__main__":
    main()
