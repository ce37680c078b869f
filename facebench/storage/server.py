"""A local S3-compatible object server, for trying data in a bucket and for the tests.

    python -m facebench.storage.server start     # on 127.0.0.1:8090, data under .cache/s3server/
    python -m facebench.storage.server status
    python -m facebench.storage.server stop

It is OpenStack Swift with its s3api middleware (the `s3server` extra): objects are files on disk,
and it speaks S3's REST API with v4 signatures (GET with Range, ListObjectsV2, multipart upload),
so every client a loader uses (obstore, boto3, the AWS CRT, pyarrow, LitData's) talks to it as to
a bucket. Four daemons (proxy, object, container, account) run as processes of their own, each
started with facebench/storage/swift_daemon.py, plus memcached where it is installed: Swift's
proxy keeps its account and container lookups there, and answers about twice as many GETs a
second with it (without it, it works, slower, and `start` says so).

One user, whose S3 keys are ACCESS_KEY and SECRET_KEY, may create buckets and read and write
anything; `start` prints the keys and the `storage.*` overrides to use. The data stays between
starts; `stop` ends the daemons and keeps it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from facebench.errors import StorageError
from facebench.host.children import alive, end_groups, spawn
from facebench.host.paths import cache_dir
from facebench.host.ports import free_port, listeners, port_in_use
from facebench.storage.swift_config import (
    ACCESS_KEY,
    DAEMON,
    REGION,
    SECRET_KEY,
    write_configs,
    write_rings,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 8090
BUCKET = "facebench"  # created at start
STATE = "server.json"
_DAEMONS = ("account", "container", "object", "proxy")  # started in this order, proxy last
_READY_S = 60.0
_ATTEMPTS = 3  # starts on fresh ports, where another program took one meanwhile


@dataclass(frozen=True)
class Running:
    """A started server: where it answers, its processes, and where its files are."""

    endpoint: str
    root: str
    pids: dict[str, int]
    memcached: bool

    def overrides(
        self, url: str = f"s3://{BUCKET}/data", profile: str = "s3", emulate: bool = True
    ) -> list[str]:
        """The `storage.*` overrides that point a run at data under `url` on this server: with
        the profile's distance emulated (storage=s3: S3 Standard's), or as the server answers."""
        return [
            f"storage={profile}",
            f"storage.url={url}",
            f"storage.endpoint={self.endpoint}",
            f"storage.region={REGION}",
            *([] if emulate else ["storage.emulate=false"]),
        ]

    def environment(self) -> dict[str, str]:
        """Its credentials, the standard AWS way."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}


def server_root(configured: str = "") -> Path:
    """Where the server keeps its objects, configs and logs: facebench's cache, by default."""
    return Path(configured).expanduser().resolve() if configured else cache_dir() / "s3server"


def running(root: Path) -> Running | None:
    """The server whose files are under root, if it is up (every daemon alive)."""
    state = root / STATE
    if not state.is_file():
        return None
    server = Running(**json.loads(state.read_text()))
    return server if all(alive(pid) for pid in server.pids.values()) else None


class _PortTaken(Exception):
    """Another program took a port chosen for a daemon before the daemon could bind it."""


def _wait_ready(server: Running, logs: Path, ports: list[int]) -> None:
    """Until every daemon listens on its port and the proxy answers; _PortTaken where another
    program listens on one (a request the proxy sent there would get a stranger's answer)."""
    deadline = time.monotonic() + _READY_S
    url = f"{server.endpoint}/healthcheck"
    ours = set(server.pids.values())  # each daemon leads its own process group
    while True:
        dead = [kind for kind, pid in server.pids.items() if not alive(pid)]
        if dead:
            raise StorageError(
                f"the local object server's {dead[0]} daemon exited at start: see "
                f"{logs / (dead[0] + '.log')}"
            )
        holders = listeners(ports)
        taken = [port for port, pid in holders.items() if _group(pid) not in ours]
        if taken:
            raise _PortTaken(taken)
        with contextlib.suppress(OSError):
            if len(holders) == len(ports):
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
        if time.monotonic() > deadline:
            raise StorageError(
                f"the local object server did not answer at {url} within {_READY_S:.0f} s: "
                f"see the logs in {logs}"
            )
        time.sleep(0.2)


def start(root: Path, port: int = DEFAULT_PORT, detached: bool = True) -> Running:
    """Start the server with its data under root, answering on 127.0.0.1:port (0: any free
    port); return it when it answers. An already running one under root is returned as it is.

    `detached`: it outlives this process (the command); otherwise it is killed when this
    process ends, however it ends (a test's server).
    """
    already = running(root)
    if already is not None:
        return already
    stop(root)  # what is left of one that half ended (a daemon killed): all of it, first
    for attempt in range(_ATTEMPTS):
        try:
            return _start(root, port, detached)
        except _PortTaken as taken:
            # Between finding a port free and a daemon binding it, another program did.
            log.info("port %s taken by another program while the server started: again (%d)",
                     taken.args[0], attempt + 1)  # fmt: skip
    raise StorageError(
        f"the local object server's ports were taken by other programs {_ATTEMPTS} times as it "
        "started: see what listens on 127.0.0.1 (ss -ltnp) and start it again"
    )


def _start(root: Path, port: int, detached: bool) -> Running:
    if importlib.util.find_spec("swift") is None:
        raise StorageError(
            "the local object server needs OpenStack Swift: pip install -e '.[s3server]'"
        )
    if port and port_in_use(port):
        raise StorageError(
            f"127.0.0.1:{port} is in use by another program: start the server on another port "
            "(--port)"
        )
    for folder in ("conf", "data/d1", "logs"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    ports = {kind: free_port() for kind in ("account", "container", "object")}
    ports["proxy"] = port or free_port()
    memcache_port = free_port()
    logs = root / "logs"
    write_rings(root / "conf", ports)
    write_configs(root, ports, memcache_port)
    pids: dict[str, int] = {}
    memcached = shutil.which("memcached")
    if memcached:
        user = ["-u", "root"] if os.geteuid() == 0 else []  # memcached will not run as root else
        command = [memcached, *user, "-l", "127.0.0.1", "-p", str(memcache_port), "-m", "64"]
        pids["memcached"] = _daemon(command, logs / "memcached.log", detached)
    else:
        log.warning(
            "memcached is not installed: the local object server runs without its cache, about "
            "half as fast (apt-get install memcached)"
        )
    for kind in _DAEMONS:
        conf = root / "conf" / f"{kind}-server.conf"
        command = [*DAEMON, kind, str(root / "conf" / "swift.conf"), str(conf)]
        pids[kind] = _daemon(command, logs / f"{kind}.log", detached)
    server = Running(f"http://127.0.0.1:{ports['proxy']}", str(root), pids, bool(memcached))
    try:
        _wait_ready(server, logs, [*ports.values(), *([memcache_port] if memcached else [])])
    except BaseException:
        end_groups(server.pids.values())
        raise
    _create_bucket(server, BUCKET)
    (root / STATE).write_text(json.dumps(asdict(server)))
    return server


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _daemon(command: list[str], log_path: Path, detached: bool) -> int:
    """One of the server's daemons started; its pid, kept in server.json for `stop`. Detached,
    it outlives this process (the command); else it dies with it (a test's server)."""
    return spawn(command, log_path=log_path, dies_with_parent=not detached).pid


def _create_bucket(server: Running, bucket: str) -> None:
    """The bucket the printed commands name, so that they work as they are (kept if there)."""
    import boto3
    import botocore.exceptions

    s3 = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    try:
        s3.create_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise StorageError(
                f"{server.endpoint}: bucket {bucket} not created ({error})"
            ) from None


def stop(root: Path) -> bool:
    """Stop the server under root, keeping its data; False if none was running."""
    state = root / STATE
    if not state.is_file():
        return False
    server = Running(**json.loads(state.read_text()))
    end_groups(server.pids.values())
    state.unlink()
    return True


@contextlib.contextmanager
def local_server(root: Path, port: int = 0) -> Iterator[Running]:
    """A server for the duration of a block (a test's), ended with it or with this process."""
    server = start(root, port, detached=False)
    try:
        yield server
    finally:
        stop(root)


def _describe(server: Running) -> str:
    keys = " ".join(server.overrides())
    credentials = " ".join(f"{name}={value}" for name, value in server.environment().items())
    cache = "" if server.memcached else " (without memcached: slower)"
    return (
        f"local object server at {server.endpoint}{cache}, data in {server.root}\n"
        f"credentials:  export {credentials}\n"
        f"runs:         python train.py {keys}\n"
        f"upload:       python prepare.py {keys}\n"
        f"stop:         python -m facebench.storage.server stop"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m facebench.storage.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the S3 endpoint's port")
    parser.add_argument("--root", default="", help="where its data live (.cache/s3server/)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = server_root(args.root)
    try:
        if args.action == "start":
            log.info("%s", _describe(start(root, args.port)))
        elif args.action == "stop":
            log.info("stopped; the data stay in %s" if stop(root) else "not running (%s)", root)
        else:
            server = running(root)
            if server is None:
                log.info("not running (%s)", root)
                return 1
            log.info("%s", _describe(server))
    except StorageError as error:
        log.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
