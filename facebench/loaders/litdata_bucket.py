"""LitData reading a bucket: its S3 downloader, each chunk it fetches counted as one GET, and a
fetch that fails ended at once in facebench's one line, in whichever worker made it.

Against litdata==0.2.76 (as pinned), which this reaches into: its download thread's crash
report, its reader's wait for a chunk, and its sync download, which returns quietly where the
server answered 404 (it suppresses FileNotFoundError, as obstore raises for NoSuchKey and
NoSuchBucket), leaving a worker to wait 120 s for a chunk that will not come.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from facebench import stages
from facebench.errors import ConfigError, StorageError
from facebench.shards import litdata_format
from facebench.storage import client, objects

# Chunks downloaded by LitData's threads in this process, not yet counted with a batch: (bytes,
# ns). The stage times are per thread, so the thread that reads the next item takes them.
_downloads: list[tuple[int, int]] = []
_downloads_lock = threading.Lock()


def take_downloads() -> None:
    with _downloads_lock:
        taken = _downloads[:]
        _downloads.clear()
    for size, latency in taken:
        stages.fetched(size, latency, latency, 0, 0)


@functools.cache
def counting_downloader() -> type:
    """LitData's S3 downloader, each chunk it downloads counted (registered for s3:// on first
    use, in the process that forks the workers)."""
    from litdata.streaming.downloader import S3Downloader, register_downloader

    class CountingS3Downloader(S3Downloader):
        """Counts each chunk where LitData publishes a download: once per object this process
        fetched, whichever of its sync or asyncio paths fetched it (two workers that both need
        a chunk neither has may each fetch it: both count), timed from when it was asked for."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._asked: dict[str, int] = {}

        def download_file(self, remote_filepath: str, local_filepath: str) -> None:
            self._asked.setdefault(local_filepath, time.perf_counter_ns())
            try:
                super().download_file(remote_filepath, local_filepath)
            except Exception as error:
                raise _failed(remote_filepath, local_filepath, error) from None
            if not os.path.exists(local_filepath) and _nobody_fetching(local_filepath):
                raise _failed(remote_filepath, local_filepath, _why_missing(remote_filepath))

        async def adownload_file(self, remote_filepath: str, local_filepath: str) -> None:
            self._asked.setdefault(local_filepath, time.perf_counter_ns())
            try:
                await super().adownload_file(remote_filepath, local_filepath)
            except Exception as error:
                raise _failed(remote_filepath, local_filepath, error) from None

        def _publish_file(self, tmp_path: str, local_filepath: str) -> None:
            size = os.path.getsize(tmp_path)
            asked = self._asked.pop(local_filepath, None)
            super()._publish_file(tmp_path, local_filepath)
            # Not the index, which the main process fetches once before the epoch (its forked
            # workers would each count it again).
            if asked is not None and not local_filepath.endswith(litdata_format.INDEX):
                with _downloads_lock:
                    _downloads.append((size, time.perf_counter_ns() - asked))

    register_downloader("s3://", CountingS3Downloader, overwrite=True)
    _fail_fast()
    return CountingS3Downloader


def _failed(remote_filepath: str, local_filepath: str, error: Exception) -> StorageError:
    """A chunk's failed download as facebench's one line, written beside the chunks too: the
    worker that waits for a chunk another worker was fetching reads it there."""
    failure = error if isinstance(error, StorageError) else client.failed(remote_filepath, error)
    _quiet_closed_loop()
    _quiet_unretrieved()
    with contextlib.suppress(OSError):
        (Path(local_filepath).parent / _FAILED).write_text(str(failure), encoding="utf-8")
    return failure


def _nobody_fetching(local_filepath: str) -> bool:
    """Whether no process holds the lock LitData downloads `local_filepath` under: its own
    download returns quietly where another holds it, and also where the server answered 404
    (it suppresses FileNotFoundError, which obstore raises for NoSuchKey and NoSuchBucket)."""
    from filelock import FileLock, Timeout

    try:
        with FileLock(local_filepath + ".lock", timeout=0):
            return not os.path.exists(local_filepath)
    except Timeout:
        return False


def _why_missing(remote_filepath: str) -> Exception:
    """What the server answers for an object a download left no file of: its error, read by
    GETting it again (a GET's answer names the error, a HEAD's has no body)."""
    try:
        objects.read(remote_filepath)
    except StorageError as error:
        return error
    hint = (
        "; with storage.path_style=false its downloader asks for bucket.host/key, which this "
        "server does not take: use storage.path_style=true"
        if not client.configured().path_style
        else ""
    )
    return StorageError(
        f"{remote_filepath}: LitData's download of it was answered 404, though the server "
        f"gives the object to a GET{hint}"
    )


def _quiet_closed_loop() -> None:
    """Once a download failed: LitData closes its download thread's event loop as the failure
    ends the thread, and obstore, finishing another chunk's GET, then reports the closed loop
    through sys.excepthook (a traceback after facebench's one line). That report is dropped."""
    previous = sys.excepthook
    if getattr(previous, "quiet_closed_loop", False):
        return

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(kind, error, trace)

    hook.quiet_closed_loop = True  # type: ignore[attr-defined]
    sys.excepthook = hook


class _Unretrieved(logging.Filter):
    """Drops asyncio's report of a chunk download's StorageError that no task awaited."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, StorageError)


def _quiet_unretrieved() -> None:
    """Once a download failed: LitData gathers several chunks' downloads in one asyncio task
    (its async prefetch), which ends with the first failure; another that fails after it has
    none to await it, and asyncio logs "Task exception was never retrieved" with a traceback
    (after facebench's one line, now and then). The same failure, said once, is enough."""
    says = logging.getLogger("asyncio")
    if not any(isinstance(kept, _Unretrieved) for kept in says.filters):
        says.addFilter(_Unretrieved())


# Beside a job's chunks: a download that failed, in whichever worker made it.
_FAILED = ".facebench-fetch-failed"


def _fail_fast() -> None:
    """A failed download ends the epoch at once, in one line (litdata==0.2.76, as pinned):
    every worker waiting for a chunk (a second at a time, up to LitData's 120 s) checks for a
    failure its download thread or another worker's recorded, and the download thread's crash
    report, a traceback on stderr, is left out for a failed fetch (the reader raises it)."""
    from litdata.streaming.item_loader import BaseItemLoader
    from litdata.streaming.reader import PrepareChunksThread

    check, report = BaseItemLoader._raise_if_prefetch_crashed, PrepareChunksThread._report_crash

    def _raise_if_prefetch_crashed(self: Any, chunk_filepath: str) -> None:
        failed = Path(chunk_filepath).parent / _FAILED
        if failed.exists():
            raise StorageError(failed.read_text(encoding="utf-8"))
        check(self, chunk_filepath)

    def _report_crash(self: Any, exc: BaseException) -> None:
        if not isinstance(exc, StorageError):
            report(self, exc)

    BaseItemLoader._raise_if_prefetch_crashed = _raise_if_prefetch_crashed
    PrepareChunksThread._report_crash = _report_crash


def allow_plain_http(endpoint: client.Endpoint) -> None:
    """Let LitData's obstore path reach an http:// endpoint (a local server, MinIO): LitData
    builds its obstore S3Store with fixed client options that lack allow_http, so every chunk
    GET there fails with "builder error" (its boto3 path, used for index.json, works). The
    option is added to those (litdata==0.2.76, as pinned) only for such an endpoint."""
    if not endpoint.address.startswith("http://"):
        return
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if not isinstance(options, dict):
        raise ConfigError(
            f"this litdata ({downloader.__name__}) keeps its obstore options elsewhere; "
            f"storage.endpoint={endpoint.address} needs them to allow http. Install the pinned "
            'version: pip install -e ".[litdata]", or use an https endpoint'
        )
    downloader._OBSTORE_CLIENT_OPTIONS = {**options, "allow_http": "true"}


def fetch_failure(error: BaseException) -> StorageError | None:
    """The failed fetch behind an error of LitData's reader, if one is."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, StorageError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
