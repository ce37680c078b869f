"""Hugging Face datasets reading Parquet from a bucket: through its own S3 client, s3fs
(fsspec), given the job's endpoint, addressing and bounded retries as storage_options, and each
GET it makes counted in the storage_* metrics.

datasets opens s3:// files through fsspec's registry, so a subclass of s3fs's file system that
counts every get_object is registered for s3:// in the process that reads (and inherited by its
forked workers). s3fs hands back a streamed body: each GET is counted with its time to the
answer's headers, as its first byte and its latency, and with the bytes the answer announced.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any

from facebench import stages
from facebench.shards.manifest import Folder
from facebench.storage import client
from facebench.storage.address import in_bucket
from facebench.storage.clients import fsspec as fsspec_client

# GETs made by s3fs's thread in this process, not yet counted with a batch: (bytes, ns).
_gets: list[tuple[int, int]] = []
_lock = threading.Lock()


def _forked() -> None:
    """A forked worker counts its own GETs, not those its parent made before the fork."""
    global _lock
    _lock = threading.Lock()
    _gets.clear()


os.register_at_fork(after_in_child=_forked)


def storage_options(folder: Folder) -> dict[str, Any] | None:
    """datasets' storage_options for a set in a bucket (None for a local folder)."""
    if not (isinstance(folder, str) and in_bucket(folder)):
        return None
    endpoint = client.configured()
    options = fsspec_client.options(endpoint)
    # No facebench retry loop wraps datasets' reads: s3fs retries (503s, dropped connections).
    options["config_kwargs"]["retries"]["total_max_attempts"] = endpoint.attempts
    return options


def _drain() -> list[tuple[int, int]]:
    with _lock:
        taken = _gets[:]
        _gets.clear()
    return taken


def take_gets() -> None:
    """Count the GETs made since the last take for the batch this thread assembles next."""
    for size, latency in _drain():
        stages.fetched(size, latency, latency, 0, 0)


def set_up_gets() -> dict[str, float]:
    """The GETs made before the clock (datasets' copy of a bucket's files), as job metrics."""
    taken = _drain()
    if not taken:
        return {}
    return {
        "parquet_copy_gets": float(len(taken)),
        "parquet_copy_mb": sum(size for size, _ in taken) / 1e6,
    }


@functools.cache
def counting() -> None:
    """Register the counting s3fs for s3:// (once per process; a no-op without s3fs, which
    only a set in a bucket needs)."""
    try:
        import fsspec
        import s3fs
    except ImportError:
        return

    class CountingS3FileSystem(s3fs.S3FileSystem):
        # s3fs retries what it deems transient 5 times by default, beyond botocore's
        # attempts (storage.attempts, in storage_options): one try of its own.
        retries = 1

        async def _call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
            if method != "get_object":
                return await super()._call_s3(method, *args, **kwargs)
            start = time.perf_counter_ns()
            answer = await super()._call_s3(method, *args, **kwargs)
            elapsed = time.perf_counter_ns() - start
            with _lock:
                _gets.append((int(answer.get("ContentLength", 0)), elapsed))
            return answer

    fsspec.register_implementation("s3", CountingS3FileSystem, clobber=True)
