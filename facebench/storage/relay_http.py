"""HTTP/1.1 for the distance's relay (facebench/storage/relay.py), through h11: reading a peer's
next event with a deadline, sending events, pacing bodies, and the answers the relay makes
itself (503 SlowDown, 502 when the endpoint fails, its counters).

h11 (the sans-I/O HTTP/1.1 state machine under httpx and uvicorn) frames every message by the
RFC: informational 1xx responses (an upload's `100 Continue`) before the final one, bodies
framed by length, by chunks or by the connection's end, and malformed framing raised as a
protocol error rather than read past. Pure Python, it keeps the relay's copy path to parsing
one request and writing one response; aiohttp would bring a server and client of its own that
set headers themselves, where a relay must pass the endpoint's on unchanged.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from xml.sax.saxutils import escape

import h11

CHUNK = 64 * 2**10  # bytes sent at a time, and the unit bandwidth is paced in
READ = 64 * 2**10  # bytes read from a socket at a time
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce '
    b"your request rate.</Message></Error>"
)


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


def bytes_per_s(mbps: float) -> float:
    return mbps * 1e6 / 8


class Stamped(asyncio.StreamReaderProtocol):
    """A connection's protocol that notes when its bytes last arrived: the moment a request
    reached the host, which its emulated latency counts from. The event loop hands every ready
    socket its bytes before any waiting coroutine resumes, so a burst of requests is stamped as
    it came, not as each is parsed in turn (up to several ms later on a busy core)."""

    received_at = 0.0

    def data_received(self, data: bytes) -> None:
        self.received_at = time.monotonic()
        super().data_received(data)


async def stamped_server(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    port: int,
    limit: int,
) -> asyncio.Server:
    """asyncio.start_server on 127.0.0.1, its connections' protocols Stamped."""
    loop = asyncio.get_running_loop()

    def protocol() -> Stamped:
        return Stamped(asyncio.StreamReader(limit=limit, loop=loop), serve, loop=loop)

    return await loop.create_server(protocol, "127.0.0.1", port)


def arrived_at(writer: asyncio.StreamWriter) -> float:
    """When the connection's latest bytes arrived (now, for a connection not Stamped)."""
    protocol = writer.transport.get_protocol()
    return getattr(protocol, "received_at", 0.0) or time.monotonic()


class Peer:
    """One side of a relayed exchange: a socket's streams and h11's state for it."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, role: type[h11.Sentinel]
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(role)

    async def next_event(self, timeout_s: float | None = None) -> h11.Event | type[h11.Sentinel]:
        """The peer's next event, reading as needed; asyncio.TimeoutError past timeout_s with
        nothing complete; h11.RemoteProtocolError for malformed HTTP."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await asyncio.wait_for(self.reader.read(READ), timeout_s)
            self.h11.receive_data(data)  # b"": the peer closed; h11 says what that ends

    async def send(self, event: h11.Event, pace: list[Pace | None] | None = None) -> None:
        """Send one event; a body's data paced by each of `pace` that is set."""
        data = self.h11.send(event)
        if data is None:  # h11.ConnectionClosed
            return
        if pace and isinstance(event, h11.Data):
            wait = max(bucket.wait_for(len(data)) if bucket else 0.0 for bucket in pace)
            if wait:  # a token bucket: a late wake-up is made up on the next chunk
                await asyncio.sleep(wait)
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


@dataclass
class Prepared:
    """A response made ready before its time: its head and its body's first chunk as the bytes
    to write (h11-framed), and what is left of its body, bytes or an open file's span (fd, at,
    stop; closed once sent). At its time the relay writes the bytes at once: a burst of
    answers due together then costs a write each, not each one's framing and reading."""

    first: bytes
    rest: bytes = b""
    span: tuple[int, int, int] | None = None


def prepare(
    client: Peer,
    status: int,
    reason: str,
    headers: list,
    body: bytes | None,
    span: tuple[int, int, int] | None = None,
) -> Prepared:
    """A response the relay makes (from its copy, or its own), framed now: `body`, or the span
    of an open file, or none (a HEAD's)."""
    if body is not None and not any(name.lower() == b"content-length" for name, _ in headers):
        size = span[2] - span[1] if span is not None else len(body)
        headers = [*headers, (b"content-length", str(size).encode())]
    data = client.h11.send(h11.Response(status_code=status, reason=reason, headers=headers)) or b""
    if span is not None:
        fd, start, stop = span
        chunk = os.pread(fd, min(CHUNK, stop - start), start)
        body, span = chunk, (fd, start + len(chunk), stop)
    first, rest = (body or b"")[:CHUNK], (body or b"")[CHUNK:]
    if first:
        data += client.h11.send(h11.Data(data=first)) or b""
    if span is not None and span[1] >= span[2]:
        os.close(span[0])
        span = None
    if not rest and span is None:
        data += client.h11.send(h11.EndOfMessage()) or b""
    return Prepared(data, rest, span)


async def send_prepared(client: Peer, prepared: Prepared, pace: list[Pace | None]) -> None:
    """The prepared bytes, then the rest of the body a chunk at a time, paced."""
    try:
        wait = max((bucket.wait_for(len(prepared.first)) for bucket in pace if bucket), default=0)
        if wait:
            await asyncio.sleep(wait)
        client.writer.write(prepared.first)
        await client.writer.drain()
        for at in range(0, len(prepared.rest), CHUNK):
            await client.send(h11.Data(data=prepared.rest[at : at + CHUNK]), pace)
        if prepared.span is not None:
            fd, start, stop = prepared.span
            for at in range(start, stop, CHUNK):
                await client.send(h11.Data(data=os.pread(fd, min(CHUNK, stop - at), at)), pace)
        if prepared.rest or prepared.span is not None:
            await client.send(h11.EndOfMessage())
    finally:
        if prepared.span is not None:
            os.close(prepared.span[0])


async def send_answer(
    client: Peer, status: int, reason: str, headers: list, body: bytes | None, pace: list
) -> None:
    """A response the relay makes itself (503, 502, its counters), framed and sent now."""
    await send_prepared(client, prepare(client, status, reason, headers, body), pace)


def made_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Headers of an answer the relay makes: these, with a date and a request id of its own."""
    own = [
        ("date", email.utils.formatdate(usegmt=True)),
        ("x-amz-request-id", secrets.token_hex(8).upper()),
    ]
    return [(name.encode(), value.encode("latin-1")) for name, value in [*headers, *own]]


def error_answer(status: int, reason: str, code: str, message: str, closing: bool) -> tuple:
    """An S3-style error (status, reason, headers, XML body) the relay answers itself."""
    body = (
        _SLOW_DOWN
        if code == "SlowDown"
        else (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>'
            f"{escape(message)}</Message></Error>"
        ).encode()
    )
    headers = [("content-type", "application/xml"), ("content-length", str(len(body)))]
    if code == "SlowDown":
        headers.append(("retry-after", "1"))
    if closing:
        headers.append(("connection", "close"))
    return status, reason, made_headers(headers), body


def slow_down(closing: bool) -> tuple:
    return error_answer(503, "Slow Down", "SlowDown", "", closing)


def bad_gateway(endpoint: str, why: str) -> tuple:
    """The endpoint failed before it answered: refused, reset, or malformed HTTP."""
    message = f"the endpoint {endpoint} did not answer the relay: {why}"
    return error_answer(502, "Bad Gateway", "BadGateway", message, closing=True)
