"""The distance's relay: an asyncio HTTP relay in front of a plain http:// S3 endpoint that
holds each response's first byte back, paces bodies and refuses requests past a rate
(facebench/storage/distance.py says what the distance is and starts this for a job).

    python -m facebench.storage.relay --upstream http://127.0.0.1:8090 --latency-ms 20
      -> relays 127.0.0.1:<port> to the endpoint; prints "listening on <port>"

Per request, in order:

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
address still verify at the endpoint (which signs what it receives).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from facebench.storage.distance import FIELDS, Distance, option
from facebench.storage.relay_http import (
    Message,
    Pace,
    bytes_per_s,
    read_message,
    relay_body,
    slow_down,
)

COUNTERS_REQUEST = b"GET /__relay "
_HEAD_LIMIT = 64 * 2**10  # the most a request's or response's head may take


class Relay:
    """The relay's state: the endpoint, the distance, the shared limits, and what it relayed."""

    def __init__(self, host: str, port: int, distance: Distance) -> None:
        self.host = host
        self.port = port
        self.distance = distance
        rate = distance.requests_per_s
        self.requests = Pace(rate, rate) if rate else None
        link = bytes_per_s(distance.total_mbps)
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
        per_connection = bytes_per_s(self.distance.bandwidth_mbps)
        pace = Pace(per_connection, per_connection / 10) if per_connection else None
        try:
            while True:
                request = await read_message(reader, request=True)
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
                    writer.write(slow_down(closing=with_body))
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
                await relay_body(response, up_reader, writer, pace, self.link)
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
        request: Message,
        reader: asyncio.StreamReader,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> Message | None:
        """Send the request on; the response's head (None: the connection was closed)."""
        up_reader, up_writer = upstream
        try:
            up_writer.write(request.head)
            await relay_body(request, reader, up_writer, None, None)
            return await read_message(up_reader, request=False, method=request.method)
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


async def _main(upstream: str, distance: Distance, port: int, ready: asyncio.Event | None) -> None:
    if not upstream.startswith("http://"):
        raise SystemExit(f"{upstream}: only a plain http:// endpoint can be relayed")
    host, _, upstream_port = upstream.removeprefix("http://").rstrip("/").partition(":")
    relay = Relay(host, int(upstream_port or 80), distance)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", port, limit=_HEAD_LIMIT)
    bound = server.sockets[0].getsockname()[1]
    # Not a log line: the job reads the port from it (distance._port_of), on stdout as the spawn
    # sends it there, and logging may be configured away.
    print(f"listening on {bound}", flush=True)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the endpoint: http://host:port")
    parser.add_argument("--port", type=int, default=0, help="where to listen (0: a free port)")
    for name in FIELDS:  # Distance.arguments() writes these
        parser.add_argument(f"--{option(name)}", type=float, default=0.0)
    args = parser.parse_args(argv)
    distance = Distance(**{name: getattr(args, name) for name in FIELDS})
    try:
        asyncio.run(_main(args.upstream, distance, args.port, None))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
