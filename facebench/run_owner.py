"""Which process owns an MLflow run, and closing the runs whose process is gone.

A process killed outright (the kernel's OOM killer in a container at its memory limit, SIGKILL)
never ends its run, which would stay RUNNING forever. Each run carries its process's host, pid
and start time as tags; whenever facebench next opens a run in the same experiment, on the same
host, a RUNNING run whose process no longer exists is marked KILLED, with a tag saying why.
Runs of other hosts (a shared tracking server) are left alone: their processes cannot be seen
from here.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import psutil

from facebench import cgroups

log = logging.getLogger(__name__)

HOST_TAG = "owner_host"
PID_TAG = "owner_pid"
STARTED_TAG = "owner_started"  # the process's start time, so that a reused pid is not taken for it
ENDED_TAG = "ended_by"
_SAME_START_S = 1.0


def tags() -> dict[str, str]:
    """This process, as a run's tags."""
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        STARTED_TAG: f"{psutil.Process().create_time():.2f}",
    }


def alive(pid: int, started: float) -> bool:
    """Whether the process `pid` that started at `started` still runs (not a reused pid, not a
    zombie). A process that cannot be looked at is taken to run."""
    try:
        process = psutil.Process(pid)
        return (
            abs(process.create_time() - started) < _SAME_START_S
            and process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def close_orphans(client: Any, experiment_id: str) -> list[str]:
    """Mark KILLED the experiment's RUNNING runs owned by a process of this host that is gone;
    the names of the runs closed."""
    host = socket.gethostname()
    runs = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'")
    closed = []
    for run in runs:
        owner = run.data.tags
        try:
            pid, started = int(owner[PID_TAG]), float(owner[STARTED_TAG])
        except (KeyError, ValueError):  # a run facebench did not open, or opened before these
            continue
        if owner.get(HOST_TAG) != host or alive(pid, started):
            continue
        reason = (
            f"its process (pid {pid}) was gone when facebench next started: killed without "
            "ending its run (by the kernel's OOM killer at a memory limit, or by SIGKILL)"
        )
        client.set_tag(run.info.run_id, ENDED_TAG, reason)
        client.set_terminated(run.info.run_id, status="KILLED")
        closed.append(run.info.run_name)
        log.warning("run %s was still RUNNING, but %s: marked KILLED", run.info.run_name, reason)
    if closed and (kills := cgroups.oom_kills()):
        log.warning(
            "this process's memory cgroup has recorded %d kill(s) by the OOM killer: see "
            "docs/errors.md on container memory limits",
            kills,
        )
    return closed
