"""The relay's HTTP against an endpoint that misbehaves on purpose (a socket server of the
test's own): an upload's `100 Continue` before the final answer, a body framed by the
connection's end, a malformed chunk, an endpoint that refuses, a connection left idle, and one
connection too many. Each ends as HTTP says, in seconds, and the relay goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from facebench.host.ports import free_port
from facebench.storage import relay_timer

_IDLE_S = 1.0


class _Endpoint(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(socketserver.StreamRequestHandler):
    """Answers by the request's path; a connection may carry several requests."""

    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = self.rfile.read(1)
                if not byte:
                    return
                head += byte
            path = head.split(b" ")[1]
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if path == b"/continue":
                assert b"expect: 100-continue" in head.lower()
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = self.rfile.read(length)
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                self.wfile.write(body)
            elif path == b"/close-framed":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                self.wfile.write(b"until the end" * 1000)
                return  # the connection's end frames the body
            elif path == b"/bad-chunk":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n")
                self.wfile.flush()
                time.sleep(0.5)
                return
            elif path == b"/bad-head":
                self.wfile.write(b"HTTP/1.1 two hundred\r\n\r\n")
                return
            else:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            self.wfile.flush()


@pytest.fixture
def endpoint() -> Iterator[int]:
    server = _Endpoint(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _relay(upstream_port: int, *options: str) -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "facebench.storage.relay", f"--upstream=http://127.0.0.1:{upstream_port}",
         "--latency-ms=2", f"--idle-s={_IDLE_S}", *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on "), line + process.stdout.read()
        yield int(line.split()[-1])
    finally:
        process.terminate()
        process.wait(timeout=10)


def _exchange(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send a request, read until the relay closes the connection or a whole response with a
    Content-Length arrives."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(request)
        return _read_response(connection)


def _read_response(connection: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            raise AssertionError(f"no end to the response: {data[:300]!r}") from None
        if not chunk:
            return data
        data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:") and len(body) >= int(
                line.split(b":")[1]
            ):
                return data
        if b"transfer-encoding: chunked" in head.lower() and body.endswith(b"0\r\n\r\n"):
            return data


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bucket\r\n\r\n".encode()


def test_an_upload_waits_for_100_continue_then_gets_the_final_answer(endpoint):
    with _relay(endpoint) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        body = b"x" * 100_000
        c.sendall(
            b"PUT /continue HTTP/1.1\r\nHost: bucket\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        interim = c.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim  # passed on, not taken as final
        c.sendall(body)
        final = _read_response(c)
        assert final.startswith(b"HTTP/1.1 200 ") and final.endswith(body), final[:200]


def test_a_body_framed_by_the_connections_end_reaches_the_client_whole(endpoint):
    with _relay(endpoint) as port:
        answer = _exchange(port, _get("/close-framed"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    # Framed again for the client (it may keep its connection): chunks that add up to it all.
    assert b"transfer-encoding: chunked" in head.lower()
    joined, rest = b"", body
    while True:
        size, _, rest = rest.partition(b"\r\n")
        if int(size, 16) == 0:
            break
        joined, rest = joined + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
    assert joined == b"until the end" * 1000


@pytest.mark.parametrize("path", ["/bad-chunk", "/bad-head"])
def test_malformed_http_from_the_endpoint_ends_in_seconds_and_the_relay_goes_on(endpoint, path):
    with _relay(endpoint) as port:
        started = time.monotonic()
        answer = _exchange(port, _get(path))
        assert time.monotonic() - started < 5
        if path == "/bad-head":  # nothing was sent yet: the relay's own answer
            assert answer.startswith(b"HTTP/1.1 502 ") and b"<Code>BadGateway</Code>" in answer
            assert b"malformed HTTP" in answer
        else:  # the head had left: the body ends short, with the connection
            assert answer.startswith(b"HTTP/1.1 200 ") and not answer.endswith(b"0\r\n\r\n")
        assert _exchange(port, _get("/fine")).endswith(b"\r\n\r\nok")


def test_an_endpoint_that_refuses_is_answered_502():
    with _relay(free_port()) as port:
        answer = _exchange(port, _get("/anything"))
    assert answer.startswith(b"HTTP/1.1 502 ") and b"connection refused" in answer


def test_an_idle_connection_is_closed_and_one_too_many_is_refused(endpoint):
    with _relay(endpoint, "--max-connections=2") as port:
        first = socket.create_connection(("127.0.0.1", port), timeout=10)
        second = socket.create_connection(("127.0.0.1", port), timeout=10)
        time.sleep(0.3)  # both accepted before the third
        answer = _exchange(port, _get("/fine"))
        assert answer.startswith(b"HTTP/1.1 503 ") and b"too many connections" in answer
        started = time.monotonic()
        assert first.recv(100) == b""  # closed by the relay, idle past its time
        assert _IDLE_S * 0.5 < time.monotonic() - started + 0.3 < _IDLE_S + 3
        second.close()
        first.close()
        time.sleep(0.2)
        assert _exchange(port, _get("/fine")).endswith(b"\r\n\r\nok")  # room again


def test_the_timer_wakes_every_waiter_never_before_its_moment():
    """relay_timer.until: waiters given out of order each wake, none before its moment (how
    soon after is the bench's to measure: bench/relay_on_time.py), and one cancelled (its
    connection gone) leaves the others waking."""
    woke: list[tuple[int, float, float]] = []

    async def wait(index: int, moment: float) -> None:
        await relay_timer.until(moment)
        woke.append((index, moment, time.monotonic()))

    async def main() -> None:
        start = time.monotonic()
        offsets = [0.030, 0.0005, 0.012, 0.004, 0.0201]
        tasks = [asyncio.create_task(wait(i, start + s)) for i, s in enumerate(offsets)]
        doomed = asyncio.create_task(wait(99, start + 0.008))
        await asyncio.sleep(0.001)
        doomed.cancel()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert sorted(index for index, _, _ in woke) == [0, 1, 2, 3, 4]  # the cancelled one not
    assert all(at >= moment for _, moment, at in woke)
