"""Ray Data's threads in the driver process, ended before Ray is shut down.

An epoch that stops before its loader's end (`max_batches`, a time limit, an error) leaves Ray
Data's machinery running in this process: the streaming executor's scheduling thread, the
iterator's `iter_threaded` workers (which `ray.get` blocks) and its block prefetcher (which
`ray.wait`s on them, and which Ray stops only at the end of a whole epoch). A thread that calls
into Ray after `ray.shutdown()` ends the whole process from Ray's C++ core ("The core worker has
already been shutdown ... The process will exit"), so `end_threads` stops each of them and waits
for it before Ray is shut down.

Found by what they are, not by their names: a thread that is a StreamingExecutor, or whose
target is a BlockPrefetcher's method, or that runs Ray Data's iterator code.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

# Ray's executor gives its scheduling loop 2 s to stop; a batch being fetched, a few more.
END_TIMEOUT_S = 10.0
_POLL_S = 0.02


def end_threads(timeout_s: float = END_TIMEOUT_S) -> list[str]:
    """Stop Ray Data's threads in this process and wait up to `timeout_s` for them to end;
    the names of those still running then (said in a warning)."""
    gc.collect()  # iterators dropped by an epoch that stopped early: their clean-up runs now
    deadline = time.monotonic() + timeout_s
    while True:
        running = ray_data_threads()
        for thread in running:
            _ask_to_stop(thread)
        if not running or time.monotonic() >= deadline:
            break
        running[0].join(_POLL_S)
    names = sorted(thread.name for thread in running)
    if names:
        log.warning(
            "raydata: Ray Data's threads %s still ran %.0f s after the epoch; Ray is shut "
            "down anyway",
            ", ".join(names),
            timeout_s,
        )
    return names


def ray_data_threads() -> list[threading.Thread]:
    """The live threads of Ray Data in this process, this one left out."""
    frames = sys._current_frames()
    found = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or not thread.is_alive():
            continue
        frame = frames.get(thread.ident or -1)
        if _is_executor(thread) or _prefetcher(thread) or _runs_ray_data_iterator(frame):
            found.append(thread)
    return found


def _ask_to_stop(thread: threading.Thread) -> None:
    prefetcher = _prefetcher(thread)
    if prefetcher is not None:
        prefetcher.stop()  # wakes its thread, which then leaves its loop
    elif _is_executor(thread):
        thread.shutdown(force=True)  # type: ignore[attr-defined]  # idempotent; joins its loop


def _is_executor(thread: threading.Thread) -> bool:
    try:
        from ray.data._internal.execution.streaming_executor import StreamingExecutor
    except ImportError:  # another Ray: its threads are found by their code below
        return False
    return isinstance(thread, StreamingExecutor)


def _prefetcher(thread: threading.Thread) -> object | None:
    try:
        from ray.data._internal.block_batching.util import BlockPrefetcher
    except ImportError:
        return None
    # A thread started with target=prefetcher._run holds its bound method.
    owner = getattr(getattr(thread, "_target", None), "__self__", None)
    return owner if isinstance(owner, BlockPrefetcher) else None


# Ray Data's iterator code: a thread whose stack passes through it is fetching or batching
# blocks. (Idle pool threads that once formatted batches wait in concurrent.futures instead.)
_ITERATOR_FOLDER = "ray/data/_internal/block_batching/"
_ASYNC_GEN = ("ray/data/_internal/util.py", ("_run_filling_worker", "_run_transforming_worker"))


def _runs_ray_data_iterator(frame: object) -> bool:
    while frame is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        if _ITERATOR_FOLDER in code.co_filename:
            return True
        if code.co_filename.endswith(_ASYNC_GEN[0]) and code.co_name in _ASYNC_GEN[1]:
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False
