"""Worker processes started from multiprocessing's forkserver, for libraries that do not survive
a fork of a process that used them (Lance's Rust runtime): `start(modules)` before the clock,
then a DataLoader with multiprocessing_context="forkserver".

The forkserver is a clean process of its own (started with exec, so no fork hook of
host/parent_death.py runs in it), and its workers are its children, not the job's: torch's
workers watch their parent, the server, which stays as long as any child holds its pipe. After a
SIGKILL of the job, server and workers lived on. So the server imports this module first (it is
preloaded): there it ends with the job, and every worker it forks dies with it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from facebench.host import parent_death

_JOB = "FACEBENCH_FORKSERVER_JOB"  # the pid of the job that starts the server


def _noop() -> None:
    """A child that does nothing: its start says that the server has loaded its modules."""


def start(modules: list[str]) -> None:
    """The forkserver running, with these modules loaded (waited for: it loads them in the
    background, which the first epoch would otherwise wait for). Once per process: a server
    already running keeps the modules it was given."""
    os.environ[_JOB] = str(os.getpid())
    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload([__name__, *modules])
    child = server.Process(target=_noop, daemon=True)
    child.start()
    child.join()


def _in_server() -> None:
    """In the forkserver (a process the job started, which preloads this module): end with the
    job, and have each worker forked from here die with this process."""
    if os.environ.get(_JOB) != str(os.getppid()):
        return  # imported elsewhere: by the job itself, or a process it did not start so
    parent_death.install()
    parent_death.end_with(os.getppid(), "the job", signal.SIGTERM, grace_s=1.0)


_in_server()
