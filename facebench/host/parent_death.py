"""Every process facebench forks ends with the process that forked it, however that one ends.

Worker processes (DataLoader's, torchdata.nodes', LitData's, the shard and data builders' pools)
are forked. torch's DataLoader workers watch their parent and leave when it is gone; the others
do not: after a SIGKILL of prepare.py or train.py they lived on as orphans, hundreds of MB each,
still writing shards. `install()` registers a fork hook so that every child forked afterwards, by
any library, asks the kernel for SIGKILL when its parent dies (Linux's PR_SET_PDEATHSIG).

The kernel sends that signal when the *thread* that forked the child ends, not the process. A
child forked from the main thread gets it (the main thread lasts as long as the process); a child
forked from another thread, which may end first, instead runs a small thread that checks every
half second whether its parent is still the one that forked it.

Ctrl-C reaches every process of the terminal's foreground group, workers included, where it
printed a KeyboardInterrupt traceback from each (torchdata.nodes', LitData's, the builders'
pools). A forked child leaves Ctrl-C to its parent, which stops the run in one line and its
workers with it. (A Python handler, not SIG_IGN: a program the child runs with exec gets the
default back.)

A process started with exec runs no fork hook of its own. facebench.host.children.spawn has the
kernel's signal asked for between fork and exec (`death_signal_asker`), for a child that may be
killed outright (the object server's daemons, the relay). `end_with()` makes one that must stop
in order (torchrun's launcher, its ranks) stop when its parent ends: its main thread is sent a
signal its own handlers act on (a launcher stops its ranks, a rank closes its run), and only one
still there after a grace period leaves at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import multiprocessing.process
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5

_installed = False
_prctl = None  # libc's prctl, found once in the parent (not in a child just forked)
_prctl_looked_up = False
_parent_pid = 0  # the forking process, as seen by the child (set just before each fork)
_forked_from_main_thread = True
_parent_tempdir: str | None = None  # multiprocessing's temporary folder of the forking process
_ending_with: int | None = None  # the parent end_with() watches, once per process


def install() -> None:
    """Make every child forked from now on die with its parent (idempotent; Linux only)."""
    global _installed
    if _installed or not sys.platform.startswith("linux"):
        return
    _find_prctl()  # where it is missing, every child watches its parent from a thread
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)
    _installed = True


def _find_prctl() -> None:
    """libc's prctl, looked up once, in a parent: a child between fork and exec only calls it
    (a lookup there could wait on a lock another of the parent's threads held at the fork)."""
    global _prctl, _prctl_looked_up
    if _prctl_looked_up:
        return
    _prctl_looked_up = True
    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def death_signal_asker(signum: signal.Signals) -> Callable[[], None] | None:
    """For a child started with exec (subprocess's preexec_fn): a function it runs between fork
    and exec, asking the kernel for `signum` when its parent dies; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    _find_prctl()
    return functools.partial(_ask_for_signal, signum)


def _ask_for_signal(signum: signal.Signals) -> bool:
    return _prctl is not None and _prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def _before_fork() -> None:
    global _parent_pid, _forked_from_main_thread, _parent_tempdir
    _parent_pid = os.getpid()
    _forked_from_main_thread = threading.current_thread() is threading.main_thread()
    _parent_tempdir = _tempdir()


def _in_child() -> None:
    signal.signal(signal.SIGINT, _left_to_parent)
    if not (_forked_from_main_thread and _ask_for_sigkill()):
        threading.Thread(target=_watch, name="facebench-parent-watch", daemon=True).start()
    if os.getppid() != _parent_pid:  # the parent died before the request was made
        os._exit(1)


def _left_to_parent(signum: int, frame: object) -> None:
    """Ctrl-C in a child: nothing; the parent stops the run, and its workers."""


def _ask_for_sigkill() -> bool:
    return _ask_for_signal(signal.SIGKILL)


def _watch() -> None:
    _outlive(_parent_pid)
    os._exit(1)


def _outlive(parent: int) -> None:
    """Return once `parent` is no longer this process's parent: it ended, and the process was
    handed to a reaper (init, or a subreaper such as a container's)."""
    while os.getppid() == parent:
        threading.Event().wait(_POLL_S)


def end_with(parent: int, name: str, signum: signal.Signals, grace_s: float) -> None:
    """Stop this process, started with exec, when `parent` ends, however that one ends: its main
    thread is sent `signum` (its handlers stop it in order), and it leaves at once if it is
    still there `grace_s` later. At once (in a moment) if `parent` is already gone.

    `parent` is passed down by the parent itself, since os.getppid() here, after a parent's
    early death, already names the reaper. A thread watches rather than the kernel's death
    signal, which comes when the parent's *thread* that started this process ends: which of its
    threads that was (torchrun's agent's, for a rank) is the parent's business. The signal goes
    to the main thread itself so that its blocking call (a sleep, a wait) is interrupted and the
    handler runs at once; sent to the process, it may land on the watching thread instead.
    Once per process: a later call (the next job of a sweep in the same rank) changes nothing.
    """
    global _ending_with
    if _ending_with is not None or not hasattr(signal, "pthread_kill"):  # not on Windows
        return
    _ending_with = parent
    threading.Thread(
        target=_stop_when_gone,
        args=(parent, name, signum, grace_s),
        name="facebench-parent-watch",
        daemon=True,
    ).start()


def _stop_when_gone(parent: int, name: str, signum: signal.Signals, grace_s: float) -> None:
    _outlive(parent)
    main = threading.main_thread().ident
    if main is not None:
        # ProcessLookupError: the main thread has ended, and the process is ending anyway.
        with contextlib.suppress(ProcessLookupError):
            signal.pthread_kill(main, signum)
    # After the signal, so that the stop never waits on the line (a log handler's lock).
    log.warning("%s (pid %d) is gone: stopping this process (pid %d)", name, parent, os.getpid())
    threading.Event().wait(grace_s)
    os._exit(128 + signum)


def _tempdir() -> str | None:
    return multiprocessing.process.current_process()._config.get("tempdir")


def remove_own_tempdir() -> None:
    """Remove the temporary folder multiprocessing made for this forked process (where it keeps
    the sockets it passes file descriptors through), for a child about to leave with os._exit,
    which skips the clean-up that would remove it. The parent's folder, inherited, stays."""
    own = _tempdir()
    if own and own != _parent_tempdir:
        shutil.rmtree(own, ignore_errors=True)
