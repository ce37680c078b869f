"""This machine's TCP ports on the loopback interface: one free for a server facebench starts,
and whether one is taken."""

from __future__ import annotations

import socket

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
