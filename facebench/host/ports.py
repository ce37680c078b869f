"""This machine's TCP ports on the loopback interface: one free for a server facebench starts,
whether one is taken, and by whom.

A port free_port() found free may be taken by another program before the server meant for it
binds it: a server started on such ports checks who listens there (listeners) before it
trusts an answer."""

from __future__ import annotations

import socket

import psutil

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on now (the kernel's choice): for a server about to be started,
    or an address that must not answer."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something on this machine accepts connections on `port`."""
    with socket.socket() as probe:
        return probe.connect_ex((LOOPBACK, port)) == 0


def listeners(ports: list[int]) -> dict[int, int]:
    """Which process listens on each of `ports` (those something listens on): its pid."""
    wanted = set(ports)
    found = {}
    for connection in psutil.net_connections(kind="tcp"):
        listening = connection.status == psutil.CONN_LISTEN and connection.pid is not None
        if listening and connection.laddr.port in wanted:
            found[connection.laddr.port] = connection.pid
    return found
