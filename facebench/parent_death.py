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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing.process
import os
import shutil
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5

_installed = False
_prctl = None  # libc's prctl, found once in the parent (not in a child just forked)
_parent_pid = 0  # the forking process, as seen by the child (set just before each fork)
_forked_from_main_thread = True
_parent_tempdir: str | None = None  # multiprocessing's temporary folder of the forking process


def install() -> None:
    """Make every child forked from now on die with its parent (idempotent; Linux only)."""
    global _installed, _prctl
    if _installed or not sys.platform.startswith("linux"):
        return
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None  # every child then watches its parent from a thread
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)
    _installed = True


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
    return _prctl is not None and _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def _watch() -> None:
    parent = _parent_pid
    while os.getppid() == parent:
        threading.Event().wait(_POLL_S)
    os._exit(1)


def _tempdir() -> str | None:
    return multiprocessing.process.current_process()._config.get("tempdir")


def remove_own_tempdir() -> None:
    """Remove the temporary folder multiprocessing made for this forked process (where it keeps
    the sockets it passes file descriptors through), for a child about to leave with os._exit,
    which skips the clean-up that would remove it. The parent's folder, inherited, stays."""
    own = _tempdir()
    if own and own != _parent_tempdir:
        shutil.rmtree(own, ignore_errors=True)
