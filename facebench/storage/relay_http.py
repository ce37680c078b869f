"""HTTP/1.1 as the distance's relay (facebench/storage/relay.py) needs it: a message's head read
for how its body is framed, the body passed on as framed and paced, and S3's 503 SlowDown.

A relay, not a server: it parses no more than framing needs, and passes every byte on unchanged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

CHUNK = 64 * 2**10  # bytes relayed at a time, and the unit bandwidth is paced in
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


@dataclass
class Message:
    head: bytes
    method: str  # the request's (a response: the request's it answers)
    length: int | None  # Content-Length; None: chunked, or to the connection's end
    chunked: bool
    closes: bool  # Connection: close
    bodyless: bool  # a HEAD's response, 1xx, 204, 304: no body whatever the headers say


async def read_message(
    reader: asyncio.StreamReader, request: bool, method: str = ""
) -> Message | None:
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
    return Message(head, method, length_value, chunked, closes, bodyless)


async def relay_body(
    message: Message,
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
            data = await source.readexactly(min(CHUNK, left))
            left -= len(data)
            await send(data)
    else:  # a response framed by the connection's end
        while data := await source.read(CHUNK):
            await send(data)


def slow_down(closing: bool) -> bytes:
    return (
        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
        + str(len(_SLOW_DOWN)).encode()
        + (b"\r\nConnection: close" if closing else b"")
        + b"\r\nRetry-After: 1\r\n\r\n"
        + _SLOW_DOWN
    )
