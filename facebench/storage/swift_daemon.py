"""One daemon of the local object server (server.py): `python -m facebench.storage.swift_daemon
<proxy|object|container|account> <swift.conf> <daemon.conf>`; or its rings, before the daemons
start: `... rings <swift dir> <account port> <container port> <object port>`.

Swift runs on eventlet, which warns at every fork of a process that imported it: only these
processes import Swift, never the one that starts the server (a test's, a user's shell's).

Swift reads its cluster-wide settings from /etc/swift/swift.conf, a path fixed in its code; this
entry point points it at the server's own copy under .cache/ before anything of Swift's loads,
so that the server needs no root and leaves /etc alone.
"""

from __future__ import annotations

import sys

KINDS = ("proxy", "object", "container", "account")
_RINGS = ("account", "container", "object")


def write_rings(swift_dir: str, ports: list[int]) -> None:
    """One ring per kind, each with the one device d1 on its port (rebuilt every start, since
    the ports are chosen then; the objects' places on disk do not depend on them)."""
    from swift.common.ring import RingBuilder

    for kind, port in zip(_RINGS, ports, strict=True):
        builder = RingBuilder(8, 1, 1)  # 256 partitions, one replica
        device = {"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "device": "d1"}
        builder.add_dev({**device, "port": port, "weight": 100})
        builder.rebalance()
        builder.get_ring().save(f"{swift_dir}/{kind}.ring.gz")


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "rings":
        write_rings(argv[1], [int(port) for port in argv[2:]])
        return 0
    if len(argv) != 3 or argv[0] not in KINDS:
        print(f"usage: swift_daemon {{{'|'.join(KINDS)}}} SWIFT_CONF DAEMON_CONF", file=sys.stderr)
        return 2
    kind, swift_conf, daemon_conf = argv
    import swift.common.utils

    swift.common.utils.SWIFT_CONF_FILE = swift_conf
    from swift.common.wsgi import run_wsgi

    return run_wsgi(daemon_conf, f"{kind}-server", verbose=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
