"""The Ray cluster a `loader=raydata` job decodes on: a local instance started for the job and
stopped at its end, or a running cluster joined (`loader.address`) and left running.

    with ray_cluster(address, cpus, object_store_bytes) as cluster:   # outside the epoch clock
        ...                                     # Ray Data runs its tasks on cluster.nodes
    # local instance: its processes (GCS, raylet, workers) stopped; a joined cluster: left
    # (a local instance's processes go with the job even when it is killed: ray_reaper.py)

Start-up is timed as a whole (`cluster.start_s`): starting or joining, then one task per CPU
that imports what the decode tasks import (torch, Ray Data, facebench's decode stage), so that
the first epoch's clock does not count a worker process's interpreter starting.

A process already connected to Ray (a notebook's `ray.init()`) keeps its connection: the job
uses it and leaves it as it found it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from facebench.errors import LoaderFailure
from facebench.loaders.ray_reaper import Reaper
from facebench.loaders.ray_threads import end_threads

log = logging.getLogger(__name__)

# Ray's default port for `ray start --head`, and Ray Client's (ray://).
GCS_PORT, CLIENT_PORT = 6379, 10001
# How long a cluster address may take to accept a connection before the job says it does not
# answer (Ray itself waits up to a minute, or retries for longer through Ray Client).
CONNECT_TIMEOUT_S = 5.0
_TO_START = "start one there with `ray start --head`, or leave loader.address empty for a local one"


@dataclass(frozen=True)
class Cluster:
    """The cluster a job runs on, as it found it."""

    address: str  # "" for a local instance started for this job
    nodes: int
    cpus: float
    start_s: float  # starting or joining it, and its workers' imports
    started_here: bool  # a local instance this job stops at its end
    # This machine's memory in use once it was ready, over before (psutil's `used`, as the
    # epochs' peak_mem_added_mb): what a local instance's processes hold before any epoch.
    mem_added_mb: float = 0.0

    def describe(self) -> str:
        where = (
            "a local Ray instance" if self.started_here else f"the Ray cluster at {self.address}"
        )
        return f"{where}: {self.nodes} node(s), {self.cpus:g} CPUs, ready in {self.start_s:.1f} s"

    def metrics(self) -> dict[str, float]:
        return {
            "ray_start_s": self.start_s,
            "ray_nodes": self.nodes,
            "ray_cpus": self.cpus,
            "ray_start_mem_mb": self.mem_added_mb,
        }


@contextmanager
def ray_cluster(address: str, cpus: int, object_store_bytes: int) -> Iterator[Cluster]:
    """Ray for one job: with no address, a local instance of `cpus` CPUs and an object store of
    `object_store_bytes`, stopped when the job ends however it ends; with one ("auto",
    "host:port", "ray://host:port"), that cluster, joined and left running."""
    import ray  # an optional extra

    # A benchmark sends nothing anywhere: Ray's usage statistics off, unless asked for.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _quiet_ray()
    used_before = psutil.virtual_memory().used
    started = time.perf_counter()
    connected_before = ray.is_initialized()
    reaper = None
    try:
        if connected_before:
            log.info("raydata: using this process's connection to Ray, left open at the end")
        elif address:
            _join(address)
        else:
            # Started first: a job killed while Ray starts leaves nothing behind either.
            reaper = Reaper.start()
            _start_local(cpus, object_store_bytes)
        cluster = _ready(address if address or connected_before else "", started, connected_before)
        added = max(0, psutil.virtual_memory().used - used_before) / 2**20
        cluster = dataclasses.replace(cluster, mem_added_mb=added)
        log.info("raydata: %s", cluster.describe())
        yield cluster
    finally:
        # First Ray Data's threads in this process (an epoch cut short leaves them fetching
        # blocks): one that calls into Ray after the shutdown ends the process.
        end_threads()
        if not connected_before and ray.is_initialized():
            # A local instance's processes stop here; a joined cluster is only disconnected.
            ray.shutdown()
        if reaper is not None:  # what is left of the local instance goes now
            reaper.release()


def _start_local(cpus: int, object_store_bytes: int) -> None:
    import ray

    try:
        ray.init(
            _temp_dir=_short_temp_dir(),
            address="local",  # a new instance, even where RAY_ADDRESS or `ray start` says another
            num_cpus=cpus,
            object_store_memory=object_store_bytes,
            include_dashboard=False,
            log_to_driver=False,  # worker output stays in Ray's session logs
            logging_level=logging.ERROR,
        )
    except Exception as error:
        raise LoaderFailure(
            f"loader=raydata: could not start a local Ray instance ({first_line(error)}); "
            "Ray's logs say more: /tmp/ray/session_latest/logs (or under $RAY_TMPDIR, $TMPDIR)"
        ) from None


# A Unix socket's path holds at most 107 bytes; Ray's are <temp>/ray/session_<time>_<pid>/
# sockets/plasma_store, 70 bytes past <temp>/ray with a 7-digit pid.
_SOCKET_PATH_MAX, _SOCKET_SUFFIX = 107, 70


def _short_temp_dir() -> str | None:
    """Where the local instance keeps its files: Ray's own choice ($RAY_TMPDIR, $TMPDIR or
    /tmp, then ray/), unless that is too long a path for its sockets (a test's or a batch
    system's TMPDIR): then /tmp/ray, said once."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    if len(os.fsencode(os.path.join(base, "ray"))) + _SOCKET_SUFFIX <= _SOCKET_PATH_MAX:
        return None
    log.info("raydata: %s is too long a path for Ray's sockets; Ray's files go to /tmp/ray", base)
    return "/tmp/ray"


def _join(address: str) -> None:
    import ray

    if address != "auto":
        _check_answers(address)
    _token_if_any()
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as error:
        if address == "auto":
            raise LoaderFailure(
                "loader.address=auto: no Ray cluster runs on this machine "
                f"({first_line(error)}); {_TO_START}"
            ) from None
        raise LoaderFailure(
            f"loader.address={address}: Ray could not join the cluster there "
            f"({first_line(error)}); check that its head runs the same Ray version "
            "(`ray --version`) and that this machine has the cluster's token (docs/scaling.md), "
            "or leave loader.address empty for a local one"
        ) from None


def _token_if_any() -> None:
    """Present this machine's Ray token when joining, as `ray.init()` does when it starts a
    cluster: a cluster started with `ray start --head` requires it (Ray 2.60 makes one, in
    ~/.ray/auth_token, unless RAY_AUTH_MODE says otherwise), and Ray would otherwise join
    without it and retry for 20 s."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray: it decides itself
        return
    says = logging.getLogger(maybe_enable_token_auth_if_token_available.__module__)
    level = says.level
    says.setLevel(logging.ERROR)  # not its warning that the token is used: it is what we ask
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        says.setLevel(level)


def host_port(address: str) -> tuple[str, int]:
    """ "host:port", "ray://host:port" or "host" -> (host, port), with Ray's default ports."""
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host or (port and not port.isdigit()):
        raise LoaderFailure(
            f"loader.address={address}: not a Ray address; give auto, host:port (a head started "
            f"with `ray start --head`, port {GCS_PORT}) or ray://host:port (Ray Client, "
            f"port {CLIENT_PORT})"
        )
    return host, int(port) if port else CLIENT_PORT if client else GCS_PORT


def _check_answers(address: str) -> None:
    """Refuse, in seconds and in one line, an address where nothing accepts a connection."""
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else error.strerror or str(error)
        raise LoaderFailure(
            f"loader.address={address}: no Ray cluster answers at {host}:{port} ({reason}); "
            f"{_TO_START}"
        ) from None


def _ready(address: str, started: float, connected_before: bool) -> Cluster:
    """Every CPU's worker process started and importing, timed; the cluster as it is now."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 0.0)
    warm = ray.remote(num_cpus=1)(_import_decode_stage)
    ray.get([warm.remote() for _ in range(max(1, int(cpus)))])
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    started_here = not connected_before and not address
    if address == "auto":  # say which cluster "auto" found
        address = f"auto ({ray.get_runtime_context().gcs_address})"
    return Cluster(address, nodes, cpus, time.perf_counter() - started, started_here)


def _import_decode_stage() -> int:
    """In a Ray worker: import what a decode task needs; a moment's work, so that concurrent
    calls land on different workers."""
    import pyarrow  # noqa: F401
    import ray.data  # noqa: F401

    from facebench import stages

    stages.take()  # the worker's CPU time counts from here, not from its interpreter's start
    time.sleep(0.2)
    return os.getpid()


def _quiet_ray() -> None:
    """Ray Data's console chatter off: its execution plans, the line saying its progress bars
    are off (facebench shows its own), and its own report of an error that reaches the epoch
    loop anyway, in one line. Set after importing it: importing it configures its loggers."""
    import ray.data  # noqa: F401

    logging.getLogger("ray.data").setLevel(logging.CRITICAL)


def first_line(error: BaseException) -> str:
    """An error's first line (Ray's run to tracebacks), or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
