"""The relay's side facing the endpoint: a client connection's requests sent on, over one kept-
alive connection of its own, and the endpoint's responses read back (facebench/storage/relay.py
decides which requests come here, and when each response's first byte may leave).

Everything goes on unchanged, the Host header included, so that a signature made for the
relay's address still verifies at the endpoint (which signs what it receives). An upload that
asks `Expect: 100-continue` waits for the endpoint's `100 Continue` before its body is sent on.
The endpoint refusing the connection, resetting it, or answering malformed HTTP is an
EndpointFailed, which the relay answers with a 502.
"""

from __future__ import annotations

import asyncio

import h11

from facebench.storage.relay_http import Pace, Peer

_CONNECT_S = 10.0  # a connection to the endpoint, opened
_ANSWER_S = 300.0  # the endpoint's response head, once the request is sent


class EndpointFailed(Exception):
    """The endpoint did not answer a request in HTTP: why, in a few words."""


class Upstream:
    """One client connection's connection to the endpoint, opened when first needed and again
    whenever the endpoint closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.peer: Peer | None = None

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
            self.peer = None

    async def _ready(self) -> tuple[Peer, bool]:
        """The connection for the next request, and whether it was used before."""
        peer = self.peer
        if peer is not None and peer.h11.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
            peer.h11.start_next_cycle()
            return peer, True
        self.close()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), _CONNECT_S
            )
        except (OSError, TimeoutError) as error:
            raise EndpointFailed(_why(error)) from None
        self.peer = Peer(reader, writer, h11.CLIENT)
        return self.peer, False

    async def forward(self, client: Peer, request: h11.Request) -> h11.Response:
        """Send the client's request (and its body) on; the endpoint's final response head.
        A request without a body that meets a kept-alive connection the endpoint had closed is
        sent again once, on a new one, as a client would."""
        peer, reused = await self._ready()
        bodyless = client.h11.their_state is h11.DONE
        try:
            return await self._exchange(peer, client, request)
        except EndpointFailed:
            if not (reused and bodyless):
                raise
        peer, _ = await self._ready()
        return await self._exchange(peer, client, request)

    async def _exchange(self, peer: Peer, client: Peer, request: h11.Request) -> h11.Response:
        try:
            await peer.send(
                h11.Request(method=request.method, target=request.target,
                            headers=request.headers.raw_items())
            )  # fmt: skip
            if client.h11.they_are_waiting_for_100_continue:
                first = await self._response(peer, client, until_continue=True)
                if first is not None:  # a final answer before the body: it is never sent
                    return first
                await client.send(h11.InformationalResponse(status_code=100, headers=[]))
            if client.h11.their_state is not h11.DONE:
                while not isinstance(event := await client.next_event(), h11.EndOfMessage):
                    if not isinstance(event, h11.Data):
                        raise ConnectionError("the client closed mid-request")
                    await peer.send(event)
                await peer.send(event)
            response = await self._response(peer, client, until_continue=False)
        except (OSError, h11.RemoteProtocolError, h11.LocalProtocolError, TimeoutError) as error:
            self.close()
            raise EndpointFailed(_why(error)) from None
        assert response is not None
        return response

    async def _response(
        self, peer: Peer, client: Peer, until_continue: bool
    ) -> h11.Response | None:
        """The endpoint's final response head, passing other 1xx responses to the client; with
        until_continue, None at its `100 Continue`."""
        while True:
            event = await peer.next_event(_ANSWER_S)
            if isinstance(event, h11.InformationalResponse):
                if event.status_code == 100:
                    if until_continue:
                        return None
                    continue
                await client.send(event)
            elif isinstance(event, h11.Response):
                return event
            else:
                raise EndpointFailed("it closed the connection before it answered")

    async def relay_body(self, client: Peer, pace: list[Pace | None], keep: bool) -> bytes:
        """The response's body from the endpoint to the client, paced, as it comes (framed by
        length, chunks or the connection's end); the bytes too where asked to keep them."""
        assert self.peer is not None
        kept = []
        while True:
            try:
                event = await self.peer.next_event(_ANSWER_S)
            except (OSError, h11.RemoteProtocolError, TimeoutError) as error:
                self.close()
                raise EndpointFailed(_why(error)) from None
            if isinstance(event, h11.Data):
                if keep:
                    kept.append(bytes(event.data))
                await client.send(event, pace)
            elif isinstance(event, h11.EndOfMessage):
                await client.send(event)
                if self.peer.h11.our_state is h11.MUST_CLOSE or (
                    self.peer.h11.their_state is h11.MUST_CLOSE
                ):
                    self.close()  # framed by its end, or Connection: close
                return b"".join(kept)
            else:
                self.close()
                raise EndpointFailed("it closed the connection mid-body")


def _why(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if isinstance(error, h11.ProtocolError):
        return f"malformed HTTP ({error})"
    return str(error) or type(error).__name__
