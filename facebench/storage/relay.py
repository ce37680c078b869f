"""The distance's relay: an emulated bucket in front of a plain http:// S3 endpoint. It holds each
response's first byte back by the bucket's latency, paces bodies, and refuses requests past a
rate (facebench/storage/distance.py says what the distance is and starts this for a job).

    python -m facebench.storage.relay --upstream http://127.0.0.1:8090 --latency-ms 20 \\
        --latency-p99-ms 100 --copy .cache/bucket-copy/127.0.0.1_8090
      -> serves 127.0.0.1:<port>; prints "listening on <port>"

Per request, in order:

- past `requests_per_s` (a token bucket a second deep), it is answered 503 SlowDown as S3
  answers on a hot prefix (one with a body, on a connection that then closes);
- a GET or HEAD of an object in the copy (relay_copy.py), signed with the job's keys, is
  answered from the copy: the endpoint never sees it, as a real bucket's servers cost the host
  nothing; anything else goes to the endpoint (relay_upstream.py), which answers as it does;
- the response's first byte leaves a drawn latency after the request arrived (latency.py: the
  profile's median and tail; from the endpoint, or when it answers, if that is later: then the
  answer is "late", and the endpoint, not the distance, set the time);
- the body follows at `bandwidth_mbps` per connection and `total_mbps` over all of them.

Without --copy, every request goes to the endpoint (storage.answers=endpoint: to measure a
server itself). `GET /__relay` is answered by the relay itself with its counters, as JSON.
Connections idle for `--idle-s` are closed; past `--max-connections`, a new one is answered 503.
It runs under real-time scheduling where the process may (host/realtime.py), and says whether.
Credentials come in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never argv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import h11

from facebench.fetches import BUCKETS, bucket
from facebench.host.realtime import make_process_realtime
from facebench.storage.bucket_copy import BucketCopy
from facebench.storage.distance import FIELDS, Distance, option
from facebench.storage.latency import Latency
from facebench.storage.relay_copy import CopyAnswers
from facebench.storage.relay_http import (
    CHUNK,
    Pace,
    Peer,
    arrived_at,
    bad_gateway,
    bytes_per_s,
    error_answer,
    made_headers,
    prepare,
    send_answer,
    send_prepared,
    slow_down,
    stamped_server,
)
from facebench.storage.relay_timer import until
from facebench.storage.relay_upstream import EndpointFailed, Upstream

COUNTERS_TARGET = b"/__relay"
_HEAD_LIMIT = 64 * 2**10  # the most a request's head may take
# A first byte is late past its time by 2 ms or a twentieth of its latency, whichever is more:
# within that, an event loop's wake-up, not the endpoint or the relay's CPU.
_LATE_S, _LATE_SHARE = 0.002, 0.05
_WRITES = (b"PUT", b"POST", b"DELETE")


class Relay:
    """The relay's state: the endpoint, the distance, the copy, the limits, and its counters."""

    def __init__(
        self,
        endpoint: tuple[str, int],
        distance: Distance,
        latency: Latency,
        copy: CopyAnswers | None,
        idle_s: float = 60.0,
        max_connections: int = 1024,
        realtime: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.realtime = realtime  # under SCHED_RR (host/realtime.py)
        self.distance = distance
        self.latency = latency
        self.copy = copy
        self.idle_s = idle_s
        self.max_connections = max_connections
        rate = distance.requests_per_s
        self.requests = Pace(rate, rate) if rate else None
        link = bytes_per_s(distance.total_mbps)
        # Bodies paced a chunk at a time with no burst beyond it: a request's bytes take their
        # size over the bandwidth (a tenth of a second's burst once let 24 MB through in 60%
        # of that time, faster than the bound a run is held to).
        self.link = Pace(link, CHUNK) if link else None
        self.connections = 0
        self.counts = dict.fromkeys(
            ("answered", "from_copy", "from_endpoint", "refused", "late", "failed"), 0
        )
        self.endpoint_s = 0.0  # the endpoint's time to answer, over those it answered
        self.drawn = [0] * BUCKETS  # the latencies drawn, and what the clients met (ns buckets)
        self.given = [0] * BUCKETS
        self.drawn_s = self.given_s = 0.0
        # Where a request's time went: from its arrival until its answer was ready to leave
        # (parsed, its signature checked, framed from the copy; or the endpoint's answer), and
        # how long after its due time its first byte left (its wake-up, or a late answer).
        self.ready_s = self.behind_s = 0.0
        self.started = time.monotonic()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, request after request, until it closes or idles."""
        client = Peer(reader, writer, h11.SERVER)
        if self.connections >= self.max_connections:
            said = f"too many connections: the relay holds {self.max_connections} at most"
            full = error_answer(503, "Service Unavailable", "ServiceUnavailable", said, True)
            await send_answer(client, *full, [])
            client.close()
            return
        self.connections += 1
        upstream = Upstream(*self.endpoint)
        per_connection = bytes_per_s(self.distance.bandwidth_mbps)
        pace = [Pace(per_connection, CHUNK) if per_connection else None, self.link]
        try:
            while isinstance(event := await client.next_event(self.idle_s), h11.Request):
                if not await self._one(client, event, upstream, pace):
                    return
                if client.h11.states != {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
                    return
                client.h11.start_next_cycle()
        except (OSError, TimeoutError, h11.ProtocolError):
            return  # idle past its time, gone, or not HTTP: the connection ends
        finally:
            self.connections -= 1
            upstream.close()
            client.close()

    async def _one(
        self, client: Peer, request: h11.Request, upstream: Upstream, pace: list[Pace | None]
    ) -> bool:
        """Answer one request; whether its connection may carry another."""
        arrived = arrived_at(client.writer)
        if request.target == COUNTERS_TARGET:
            json_head = made_headers([("content-type", "application/json")])
            await send_answer(client, 200, "OK", json_head, self.counters(), [])
            return True
        headers: dict[str, list[str]] = {}
        for name, value in request.headers:
            headers.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
        length = headers.get("content-length", ["0"])[0].strip()
        bodyless = "transfer-encoding" not in headers and length == "0"
        if bodyless:  # its end is there already: the request is whole
            await client.next_event()
        drawn = self.latency.draw_s()
        due = arrived + drawn
        if self.requests is not None and not self.requests.take(1):
            self.counts["refused"] += 1
            await until(due)
            # A body left unread would be taken for the next request: the connection ends.
            await send_answer(client, *slow_down(closing=not bodyless), pace)
            return bodyless
        # From the copy: reads only, which carry no body (its file opened here, closed once sent).
        copied = self.copy is not None and bodyless
        answer = self.copy.answer(request.method, request.target, headers) if copied else None
        if answer is not None:  # framed while it waits: at its time, one write
            ready = prepare(
                client, answer.status, answer.reason, answer.headers, answer.body, answer.span
            )
            self.ready_s += time.monotonic() - arrived
            await until(due)
            self._note(arrived, drawn, _late(time.monotonic() - due, drawn), "from_copy")
            await send_prepared(client, ready, pace)
            return True
        return await self._from_endpoint(client, request, headers, upstream, pace, arrived, drawn)

    async def _from_endpoint(
        self, client: Peer, request: h11.Request, headers: dict[str, list[str]],
        upstream: Upstream, pace: list[Pace | None], arrived: float, drawn: float,
    ) -> bool:  # fmt: skip
        if self.copy is not None and request.method in _WRITES:
            self.copy.forget(request.target)
        try:
            response = await upstream.forward(client, request)
        except EndpointFailed as failed:
            self.counts["failed"] += 1
            await send_answer(client, *bad_gateway(_address(self.endpoint), str(failed)), [])
            return False
        answered = time.monotonic()
        self.endpoint_s += answered - arrived
        self.ready_s += answered - arrived
        await until(arrived + drawn)
        self._note(arrived, drawn, _late(answered - arrived - drawn, drawn), "from_endpoint")
        await client.send(
            h11.Response(status_code=response.status_code, reason=response.reason,
                         headers=response.headers.raw_items())
        )  # fmt: skip
        listing = b"list-type=" in request.target and request.method == b"GET"
        try:
            body = await upstream.relay_body(client, pace, keep=listing)
        except EndpointFailed:
            return False  # the head is sent: the client sees its body cut short
        if listing and self.copy is not None:
            self.copy.keep_listing(
                request.target, headers, response.status_code, response.headers.raw_items(), body
            )
        return True

    def _note(self, arrived: float, drawn: float, late: bool, source: str) -> None:
        """A request answered: where from, its drawn latency, when its first byte left."""
        given = time.monotonic() - arrived
        self.behind_s += max(0.0, given - drawn)
        self.counts["answered"] += 1
        self.counts[source] += 1
        self.counts["late"] += late
        self.drawn[bucket(int(drawn * 1e9))] += 1
        self.given[bucket(int(given * 1e9))] += 1
        self.drawn_s += drawn
        self.given_s += given

    def counters(self) -> bytes:
        """Everything counted since the start, as JSON (distance.counters reads it)."""
        return json.dumps(
            {
                **self.counts,
                "endpoint_s": self.endpoint_s,
                "drawn": self.drawn,
                "given": self.given,
                "drawn_s": self.drawn_s,
                "given_s": self.given_s,
                "ready_s": self.ready_s,
                "behind_s": self.behind_s,
                # Its own CPU time over its lifetime: near 1 (one core, asyncio's one thread),
                # the relay itself was the bound.
                "cpu_s": time.process_time(),
                "realtime": self.realtime,
                "alive_s": time.monotonic() - self.started,
            }
        ).encode()


def _late(behind_s: float, drawn_s: float) -> bool:
    return behind_s > max(_LATE_S, _LATE_SHARE * drawn_s)


def _address(endpoint: tuple[str, int]) -> str:
    return f"{endpoint[0]}:{endpoint[1]}"


async def _main(args: argparse.Namespace, distance: Distance) -> None:
    # Before any thread starts (asyncio's own inherit it): every moment the relay keeps is the
    # bucket's, and it must keep them while the loader fills the cores.
    realtime = not args.fair and make_process_realtime()
    # Its timer's thread (relay_timer.py) takes the GIL from the loop's within half a
    # millisecond, not Python's default 5, when both want it at once.
    sys.setswitchinterval(0.0005)
    if not args.upstream.startswith("http://"):
        raise SystemExit(f"{args.upstream}: only a plain http:// endpoint can be relayed")
    host, _, port = args.upstream.removeprefix("http://").rstrip("/").partition(":")
    copy = None
    if args.copy:
        keys = {
            os.environ.get("AWS_ACCESS_KEY_ID", ""): os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        }
        copy = CopyAnswers(BucketCopy.load(Path(args.copy)), {k: v for k, v in keys.items() if k})
    latency = Latency(distance.latency_ms, distance.latency_p99_ms, args.seed)
    relay = Relay((host, int(port or 80)), distance, latency, copy, args.idle_s,
                  args.max_connections, realtime)  # fmt: skip
    server = await stamped_server(relay.serve, args.port, _HEAD_LIMIT)
    # Not a log line: the job reads the port from it (distance._port_of), on stdout as the spawn
    # sends it there, and logging may be configured away.
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the endpoint: http://host:port")
    parser.add_argument("--port", type=int, default=0, help="where to listen (0: a free port)")
    parser.add_argument("--copy", default="", help="the bucket's copy (bucket_copy.py)")
    parser.add_argument("--seed", type=int, default=0, help="for the drawn latencies")
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--max-connections", type=int, default=1024)
    parser.add_argument(
        "--fair", action="store_true", help="the fair scheduler's turns, not real-time ones"
    )
    for name in FIELDS:  # Distance.arguments() writes these
        parser.add_argument(f"--{option(name)}", type=float, default=0.0)
    args = parser.parse_args(argv)
    distance = Distance(**{name: getattr(args, name) for name in FIELDS})
    try:
        asyncio.run(_main(args, distance))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
