"""What the distance relay costs, and how close each limit comes to its setting: the requests a
second it serves from its copy of the bucket (storage.answers=copy, the default) and relays to
the endpoint (storage.answers=endpoint), its CPU per GET, so its ceiling on one core.

    python bench/distance.py                 # 3,000 GETs of 20 kB objects, 16 in flight
    python bench/distance.py --gets 1000

The local object server (python -m facebench.storage.server's, on a free port, in a temporary
folder) and the relay (facebench/storage/relay.py) run on this machine's cores beside the
client. Rows: GETs straight to the server; through the relay with no limit worth the name, from
its copy and relayed (its CPU per GET); at 20 ms, constant and with S3 Standard's tail (p99 100
ms: the first bytes' percentiles against the setting); at 40 Mbit/s a connection (one 10 MB
read against the setting); at 100 requests/s (the rate that got through, and the 503s it sent).
Table `distance-relay`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from common import Bench, parser

from facebench.config import StorageConfig
from facebench.report.tables import markdown
from facebench.storage import client, objects, server
from facebench.storage.distance import counters, emulated

BUCKET = f"s3://{server.BUCKET}/relay-bench"
LARGE = 10_000_000  # bytes: the bandwidth row's one read
RELAYED = "endpoint"  # storage.answers: the endpoint answers each request, through the relay


def keys(s3: server.Running, **distance: float | str) -> StorageConfig:
    return StorageConfig(
        name="s3", url=BUCKET, endpoint=s3.endpoint, region=server.REGION, path_style=True,
        requests_per_worker=16, attempts=5, **distance,
    )  # fmt: skip


def relays() -> list[psutil.Process]:
    """This machine's relay processes (the one just started)."""
    return [
        process
        for process in psutil.process_iter(["cmdline"])
        if "facebench.storage.relay" in " ".join(process.info["cmdline"] or [])
    ]


def cpu_s(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def first_bytes_ms(url: str, n: int = 200) -> list[float]:
    """The times to first byte of n GETs made one at a time (no queue at the server), sorted."""
    return sorted(client.get(url).first_byte_ns / 1e6 for _ in range(n))


def said(first: list[float]) -> str:
    """'20.4 ms' (median), or '20.4 / 99.1 ms' (median / 99th percentile) where they differ."""
    p50, p99 = statistics.median(first), first[int(0.99 * (len(first) - 1))]
    return f"{p50:.1f} ms" if p99 < 1.5 * p50 else f"{p50:.1f} / {p99:.1f} ms"


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
        objects.put_bytes(f"{BUCKET}/large", os.urandom(LARGE), {"facebench": "1"})
        urls = [f"{BUCKET}/small"] * n
        seconds, _ = gets(urls)
        alone = said(first_bytes_ms(urls[0]))
        rows.append(["straight to the server", f"{n / seconds:,.0f} GET/s", alone, "-"])
        for label, distance in [
            # A relay runs only where a distance is asked for: 10 us stands for none.
            ("relay from its copy, 0.01 ms (no limit)", {"latency_ms": 0.01}),
            ("relay to the endpoint, 0.01 ms (no limit)", {"latency_ms": 0.01, "answers": RELAYED}),
            ("relay from its copy, 20 ms", {"latency_ms": 20.0}),
            ("relay from its copy, 20 ms, p99 100 ms", {"latency_ms": 20.0, "latency_p99_ms": 1e2}),
            ("relay from its copy, 40 Mbit/s a connection", {"bandwidth_mbps": 40.0}),
            ("relay from its copy, 100 requests/s", {"requests_per_s": 100.0}),
        ]:  # fmt: skip
            setting = keys(s3, **distance)
            with emulated(setting, Path(scratch)) as via:
                client.configure(client.Endpoint.of(setting, via))
                relay = relays()
                before = cpu_s(relay)
                if "bandwidth_mbps" in distance:
                    seconds, replies = gets([f"{BUCKET}/large"])
                    rows.append([
                        label, f"{LARGE * 8 / 1e6 / seconds:.1f} Mbit/s (one GET)",
                        "-", f"{(cpu_s(relay) - before) / (LARGE / 1e6) * 1e3:.2f} ms a MB",
                    ])  # fmt: skip
                    continue
                count = min(n, 1000) if "requests_per_s" in distance else n
                seconds, replies = gets(urls[:count])
                per_get = (cpu_s(relay) - before) / count * 1e3
                refused = counters(via)["storage_relay_503s"]
                alone = said(first_bytes_ms(urls[0])) if not distance.get("requests_per_s") else "-"
                rows.append([
                    label, f"{count / seconds:,.0f} GET/s"
                    + (f", {refused:,.0f} 503s sent (retried by the client)" if refused else ""),
                    alone, f"{per_get:.2f} ms ({1e3 / per_get:,.0f} GET/s a core)",
                ])  # fmt: skip
    header = ["path", "rate, 16 in flight", "first byte, one at a time (p50 / p99)", "relay CPU"]
    details = (
        f"{n:,} GETs of a 20 kB object ({min(n, 1000):,} for the rate row) from one process, "
        "16 in flight (CRT client), then 200 one at a time for the first byte; one GET of "
        f"{LARGE / 1e6:g} MB for the bandwidth row (paced a 64 kB chunk at a time); "
        "the local server, the relay and the client on the same two cores; nothing else ran"
    )
    body = markdown(header, rows)
    bench.publish("distance-relay", bench.section("The distance relay's cost", details, body))


if __name__ == "__main__":
    main()
