"""A Ray cluster of several nodes on this one machine, as on several: for the tests and the
benchmarks, and for trying `loader.address` before there is a real cluster.

    with one_machine_cluster(n_nodes=2, cpus_per_node=1) as nodes:
        # python train.py loader=raydata loader.address={nodes.address}, with env=nodes.env
    # every process of the cluster stopped, by its own PID

It runs what docs/scaling.md has a user run on real machines: `ray start --head`, then
`ray start --address` for each other node, with a token of their own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psutil

from facebench.errors import LoaderFailure
from facebench.host.ports import free_port
from facebench.loaders.ray_cluster import first_line
from facebench.loaders.ray_reaper import is_ray_process


@dataclass(frozen=True)
class NodesHere:
    """A Ray cluster of several nodes on this one machine, as `one_machine_cluster` started it."""

    address: str  # host:port of its head
    env: dict[str, str]  # what a process that joins it needs (its token)
    temp_dir: str  # its files, which its processes' command lines name
    port: int


@contextmanager
def one_machine_cluster(
    n_nodes: int = 2, cpus_per_node: int = 1, env: dict[str, str] | None = None
) -> Iterator[NodesHere]:
    """A cluster on this machine, as on several: a head (`ray start --head`) and n_nodes - 1
    nodes that join it (`ray start --address`), each lending cpus_per_node CPUs, with a token
    of their own. Stopped at the end by their own processes (`ray stop` would stop every Ray
    instance of this user here), which must all be gone: a LoaderFailure names any left."""
    scratch = tempfile.mkdtemp(prefix="facebench-ray-")
    token = os.path.join(scratch, "auth_token")
    with open(token, "w") as file:
        file.write(secrets.token_hex(32))
    env = {
        **(env if env is not None else os.environ),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": token,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    temp_dir = f"/tmp/facebench-ray-{secrets.token_hex(4)}"  # short: Ray's socket paths
    port = free_port()
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    lend = [f"--num-cpus={cpus_per_node}", "--disable-usage-stats"]
    here = NodesHere(f"127.0.0.1:{port}", env, temp_dir, port)
    try:
        head = [ray, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}"]
        commands = [[*head, "--include-dashboard=false", *lend]]
        commands += [[ray, "start", f"--address={here.address}", *lend]] * (n_nodes - 1)
        for command in commands:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise LoaderFailure(
                    f"{' '.join(command[1:3])} failed: {first_line(RuntimeError(done.stderr))}"
                )
        yield here
    finally:
        left = stop_cluster(temp_dir, port)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if left:
            raise LoaderFailure(f"Ray processes of the cluster at {here.address} left: {left}")


def cluster_processes(temp_dir: str, port: int) -> list[Any]:
    """The processes of the cluster whose files are in temp_dir: its GCS, raylets, agents and
    monitors (which name that folder or its port), and all they started (workers, actors)."""
    me = psutil.Process()
    spared = {me.pid, *(parent.pid for parent in me.parents())}  # whoever asks, not Ray's
    mine = []
    for process in psutil.process_iter(["cmdline"]):
        if process.pid in spared:
            continue
        line = " ".join(process.info["cmdline"] or [])
        if temp_dir in line or (f":{port} " in f"{line} " and "ray" in line):
            mine.append(process)
    for process in list(mine):
        try:
            mine.extend(process.children(recursive=True))
        except psutil.Error:
            continue
    return list({process.pid: process for process in mine}.values())


def ray_processes() -> set[int]:
    """Every Ray process on this machine, of any cluster (ray_reaper.is_ray_process)."""
    found = set()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if is_ray_process(process):
                found.add(process.pid)
    return found


def stop_cluster(temp_dir: str, port: int) -> list[int]:
    """Stop every process of that cluster: SIGTERM, then SIGKILL for those still there after
    3 s (Ray's GCS takes its time). The PIDs of any that outlived both."""
    alive = cluster_processes(temp_dir, port)
    for stop, wait_s in (("terminate", 3), ("kill", 10)):
        for process in alive:
            with contextlib.suppress(psutil.Error):
                getattr(process, stop)()
        _, alive = psutil.wait_procs(alive, timeout=wait_s)
    return sorted(process.pid for process in alive)
