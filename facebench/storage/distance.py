"""A bucket's distance, emulated: an HTTP relay in front of an S3 endpoint that adds latency,
limits bandwidth and caps the request rate, for every client alike.

    python -m facebench.storage.distance --upstream http://127.0.0.1:8090 --latency-ms 20
      -> relays 127.0.0.1:<port> to the endpoint; prints "listening on <port>"

Every loader's client (boto3, the CRT client, LitData's, Ray's tasks) speaks plain HTTP/1.1 to
it as to the endpoint; the kernel's netem would do this below them, but containers lack it. Per
request, in order:

- past `requests_per_s` (a token bucket a second deep), a request is answered 503 SlowDown as
  S3 answers on a hot prefix, without reaching the endpoint (one with a body, on a connection
  that then closes);
- otherwise it is sent on, and the response's first byte leaves `latency_ms` after the request
  arrived (or as soon as the endpoint answers, if that is later): the time to first byte;
- the body follows at `bandwidth_mbps` per connection and `total_mbps` over all of them.

`GET /__relay` is answered by the relay itself: what it has relayed and refused so far, as JSON
(clients that retry 503s inside themselves, as the CRT client does, hide them from the job; the
relay counts every one).

The request goes on unchanged, its Host header included, so S3 signatures made for the relay's
address still verify at the endpoint (which signs what it receives). Only plain http:// endpoints
can be relayed (a TLS one would need its certificate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from facebench.errors import StorageError
from facebench.storage.daemons import alive, end, spawn

log = logging.getLogger(__name__)

COUNTERS_REQUEST = b"GET /__relay "
# A relay the job's parent started for all its ranks (accelerators_per_host): the host's link
# and the prefix's request rate are shared by every rank, as on a real host.
RELAY_ENV = "FACEBENCH_RELAY"
_CHUNK = 64 * 2**10  # bytes relayed at a time, and the unit bandwidth is paced in
_HEAD_LIMIT = 64 * 2**10  # the most a request's or response's head may take
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce '
    b"your request rate.</Message></Error>"
)


@dataclass(frozen=True)
class Distance:
    """What stands between the clients and the endpoint; 0 turns a limit off."""

    latency_ms: float = 0.0
    bandwidth_mbps: float = 0.0  # per connection, megabits a second
    total_mbps: float = 0.0  # the host's link, over all connections
    requests_per_s: float = 0.0  # past it: 503 SlowDown

    @classmethod
    def of(cls, storage: Any) -> Distance:
        return cls(
            float(storage.latency_ms), float(storage.bandwidth_mbps),
            float(storage.total_mbps), float(storage.requests_per_s),
        )  # fmt: skip

    @property
    def any(self) -> bool:
        return any((self.latency_ms, self.bandwidth_mbps, self.total_mbps, self.requests_per_s))

    def arguments(self) -> list[str]:
        """The relay's command-line options for this distance."""
        return [
            f"--latency-ms={self.latency_ms}", f"--bandwidth-mbps={self.bandwidth_mbps}",
            f"--total-mbps={self.total_mbps}", f"--requests-per-s={self.requests_per_s}",
        ]  # fmt: skip

    def describe(self) -> str:
        """'20 ms, 100 Mbit/s a connection, 3,500 requests/s' (what is on)."""
        parts = []
        if self.latency_ms:
            parts.append(f"{self.latency_ms:g} ms")
        if self.bandwidth_mbps:
            parts.append(f"{self.bandwidth_mbps:g} Mbit/s a connection")
        if self.total_mbps:
            parts.append(f"{self.total_mbps:g} Mbit/s in all")
        if self.requests_per_s:
            parts.append(f"{self.requests_per_s:,.0f} requests/s")
        return ", ".join(parts)


_START_S = 15.0  # the relay's own start-up: an interpreter and asyncio, well under a second
_LISTENING = re.compile(r"listening on (\d+)")


@contextmanager
def emulated(storage: Any, folder: Path) -> Iterator[str]:
    """The job's relay in front of storage.endpoint, where storage.* asks for a distance: its
    address (empty where none is asked for). It dies with the job, however the job ends; its
    output goes to a log in `folder`, removed at the end unless the relay failed."""
    distance = Distance.of(storage)
    if storage.name == "local" or not distance.any or not storage.emulate:
        yield ""
        return
    if not storage.endpoint.startswith("http://"):
        # A real bucket: its own distance is there already, and a relay could not speak TLS.
        log.info(
            "%s is read as it is: the emulated distance (%s) applies to a plain http:// "
            "endpoint only", storage.endpoint or "AWS's endpoint", describe(storage),
        )  # fmt: skip
        yield ""
        return
    if os.environ.get(RELAY_ENV):  # the ranks' parent runs it for them all
        yield os.environ[RELAY_ENV]
        return
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"distance-relay-{os.getpid()}.log"
    log_path.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "facebench.storage.distance",
        f"--upstream={storage.endpoint}", *distance.arguments(),
    ]  # fmt: skip
    pid = spawn(command, log_path, detached=False)
    try:
        port = _port_of(log_path, pid)
        log.info(
            "emulating the bucket's distance (%s) with a relay at 127.0.0.1:%d in front of %s",
            describe(storage), port, storage.endpoint,
        )  # fmt: skip
        yield f"http://127.0.0.1:{port}"
    finally:
        end({"relay": pid})
    log_path.unlink(missing_ok=True)


def in_effect(storage: Any, via: str) -> Distance:
    """The distance a job's requests meet: the storage's, where its relay (`via`) runs; none
    where no relay does (local files, a real bucket, storage.emulate=false)."""
    return Distance.of(storage) if via else Distance()


def describe(storage: Any) -> str:
    """'S3 Standard, same region: 20 ms, 700 Mbit/s a connection, 5,500 requests/s'."""
    limits = Distance.of(storage).describe()
    return f"{storage.distance_name}: {limits}" if storage.distance_name else limits


def snapshot(via: str) -> dict[str, float]:
    """The relay's counters so far (since it started): relayed, refused, endpoint_s, late,
    cpu_s, alive_s."""
    with urllib.request.urlopen(f"{via}/__relay", timeout=5) as answer:
        return {name: float(value) for name, value in json.loads(answer.read()).items()}


def counters(via: str, since: dict[str, float] | None = None) -> dict[str, float]:
    """What the job's relay relayed and refused (503 SlowDown), since `since` (a snapshot) or
    its start, as the run's metrics: requests, 503s, the endpoint's mean time to answer, the
    share it answered after the emulated latency, and the relay's own CPU (a share of its one
    core)."""
    now = snapshot(via)
    found = {name: value - (since or {}).get(name, 0.0) for name, value in now.items()}
    relayed = max(1.0, found["relayed"])
    return {
        "storage_relay_requests": found["relayed"],
        "storage_relay_503s": found["refused"],
        "storage_relay_endpoint_ms": 1000 * found["endpoint_s"] / relayed,
        "storage_relay_late_frac": found["late"] / relayed,
        "storage_relay_cpu_frac": found["cpu_s"] / max(1e-9, found["alive_s"]),
    }


def _port_of(log_path: Path, pid: int) -> int:
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        found = _LISTENING.search(text)
        if found:
            return int(found.group(1))
        if not alive(pid):
            last = text.strip().splitlines()[-1] if text.strip() else "no output"
            raise StorageError(f"the distance relay did not start ({last}); its log: {log_path}")
        time.sleep(0.05)
    raise StorageError(f"the distance relay did not start in {_START_S:.0f} s; its log: {log_path}")


class Pace:
    """A token bucket of `rate` a second, `depth` deep: how long to wait before `amount` more."""

    def __init__(self, rate: float, depth: float) -> None:
        self.rate = rate
        self.depth = depth
        self.tokens = depth
        self.stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.depth, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, amount: float) -> bool:
        """Take `amount` if there is that much now (the request rate's test)."""
        self._refill()
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True

    def wait_for(self, amount: float) -> float:
        """Take `amount` now, in debt if need be; the seconds to wait until it is paid."""
        self._refill()
        self.tokens -= amount
        return max(0.0, -self.tokens / self.rate)


def _bytes_per_s(mbps: float) -> float:
    return mbps * 1e6 / 8


class Relay:
    """The relay's state: the endpoint, the distance, the shared limits, and what it relayed."""

    def __init__(self, host: str, port: int, distance: Distance) -> None:
        self.host = host
        self.port = port
        self.distance = distance
        rate = distance.requests_per_s
        self.requests = Pace(rate, rate) if rate else None
        link = _bytes_per_s(distance.total_mbps)
        self.link = Pace(link, link / 10) if link else None  # a tenth of a second of burst
        self.relayed = 0
        self.refused = 0
        # How long the endpoint took to answer (request sent -> response head), and how many it
        # answered after the emulated latency had passed: then the endpoint, not the distance,
        # set the time (the local server on a busy machine).
        self.endpoint_s = 0.0
        self.late = 0
        self.started = time.monotonic()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, request after request, over one endpoint connection."""
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        per_connection = _bytes_per_s(self.distance.bandwidth_mbps)
        pace = Pace(per_connection, per_connection / 10) if per_connection else None
        try:
            while True:
                request = await _read_message(reader, request=True)
                if request is None:
                    return
                if request.head.startswith(COUNTERS_REQUEST):
                    writer.write(self._counters())
                    await writer.drain()
                    continue
                arrived = time.monotonic()
                if self.requests is not None and not self.requests.take(1):
                    self.refused += 1
                    await self._after_latency(arrived)
                    # A body not read (an upload's) would be taken for the next request: the
                    # connection ends with the answer, as a server that refuses it early does.
                    with_body = request.chunked or request.length != 0
                    writer.write(_slow_down(closing=with_body))
                    await writer.drain()
                    if with_body:
                        return
                    continue
                reused = upstream is not None
                sent = time.monotonic()
                if upstream is None:
                    upstream = await asyncio.open_connection(self.host, self.port)
                response = await self._forward(request, reader, upstream)
                if response is None and reused and request.length == 0:
                    # The endpoint had closed the idle connection: a request without a body
                    # is sent again on a new one, as a client would.
                    upstream[1].close()
                    upstream = await asyncio.open_connection(self.host, self.port)
                    response = await self._forward(request, reader, upstream)
                if response is None:
                    return
                up_reader = upstream[0]
                answered = time.monotonic()
                self.endpoint_s += answered - sent
                if self.distance.latency_ms:  # with none emulated, nothing is late
                    self.late += answered > arrived + self.distance.latency_ms / 1000
                await self._after_latency(arrived)
                writer.write(response.head)
                await _relay_body(response, up_reader, writer, pace, self.link)
                self.relayed += 1
                if request.closes or response.closes:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            for stream in (writer, upstream[1] if upstream else None):
                if stream is not None:
                    stream.close()

    async def _forward(
        self,
        request: _Message,
        reader: asyncio.StreamReader,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> _Message | None:
        """Send the request on; the response's head (None: the connection was closed)."""
        up_reader, up_writer = upstream
        try:
            up_writer.write(request.head)
            await _relay_body(request, reader, up_writer, None, None)
            return await _read_message(up_reader, request=False, method=request.method)
        except ConnectionError:
            return None

    def _counters(self) -> bytes:
        body = json.dumps(
            {
                "relayed": self.relayed,
                "refused": self.refused,
                "endpoint_s": self.endpoint_s,
                "late": self.late,
                # Its own CPU time over its lifetime: near 1 (one core, asyncio's one thread),
                # the relay itself was the bound.
                "cpu_s": time.process_time(),
                "alive_s": time.monotonic() - self.started,
            }
        ).encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )

    async def _after_latency(self, arrived: float) -> None:
        wait = arrived + self.distance.latency_ms / 1000 - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass
class _Message:
    head: bytes
    method: str  # the request's (a response: the request's it answers)
    length: int | None  # Content-Length; None: chunked, or to the connection's end
    chunked: bool
    closes: bool  # Connection: close
    bodyless: bool  # a HEAD's response, 1xx, 204, 304: no body whatever the headers say


async def _read_message(
    reader: asyncio.StreamReader, request: bool, method: str = ""
) -> _Message | None:
    """A request's or response's head, parsed for how its body is framed; None at a clean end
    of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise
        return None
    except asyncio.LimitOverrunError:
        raise ConnectionError("a message head over the relay's limit") from None
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    if request:
        method = first[0]
        bodyless = False
        length_value: int | None = int(length) if length else (None if chunked else 0)
    else:
        status = int(first[1]) if len(first) > 1 and first[1].isdigit() else 0
        bodyless = method == "HEAD" or status < 200 or status in (204, 304)
        length_value = int(length) if length else None
    closes = headers.get("connection", "").lower() == "close"
    return _Message(head, method, length_value, chunked, closes, bodyless)


async def _relay_body(
    message: _Message,
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    pace: Pace | None,
    link: Pace | None,
) -> None:
    """The message's body, as framed, from source to sink, paced where limits are given."""

    async def send(data: bytes) -> None:
        wait = max(
            pace.wait_for(len(data)) if pace else 0.0, link.wait_for(len(data)) if link else 0.0
        )
        if wait:
            await asyncio.sleep(wait)
        sink.write(data)
        await sink.drain()

    if message.bodyless:
        return
    if message.chunked:
        while True:
            size_line = await source.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            await send(size_line)
            if size == 0:  # the last chunk, then trailers up to an empty line
                while True:
                    trailer = await source.readuntil(b"\r\n")
                    await send(trailer)
                    if trailer == b"\r\n":
                        return
            await send(await source.readexactly(size + 2))
    elif message.length is not None:
        left = message.length
        while left:
            data = await source.readexactly(min(_CHUNK, left))
            left -= len(data)
            await send(data)
    else:  # a response framed by the connection's end
        while data := await source.read(_CHUNK):
            await send(data)


def _slow_down(closing: bool) -> bytes:
    return (
        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
        + str(len(_SLOW_DOWN)).encode()
        + (b"\r\nConnection: close" if closing else b"")
        + b"\r\nRetry-After: 1\r\n\r\n"
        + _SLOW_DOWN
    )


async def _main(upstream: str, distance: Distance, port: int, ready: asyncio.Event | None) -> None:
    if not upstream.startswith("http://"):
        raise SystemExit(f"{upstream}: only a plain http:// endpoint can be relayed")
    host, _, upstream_port = upstream.removeprefix("http://").rstrip("/").partition(":")
    relay = Relay(host, int(upstream_port or 80), distance)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", port, limit=_HEAD_LIMIT)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on {bound}", flush=True)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the endpoint: http://host:port")
    parser.add_argument("--port", type=int, default=0, help="where to listen (0: a free port)")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=0.0)
    parser.add_argument("--total-mbps", type=float, default=0.0)
    parser.add_argument("--requests-per-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    distance = Distance(args.latency_ms, args.bandwidth_mbps, args.total_mbps, args.requests_per_s)
    try:
        asyncio.run(_main(args.upstream, distance, args.port, None))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
