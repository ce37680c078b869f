"""s3fs, fsspec's S3 file system (storage.client=fsspec): what pandas, Hugging Face datasets and
many users' own code read buckets through.

One S3FileSystem per process, made for it alone (skip_instance_cache: fsspec's cache would hand
a forked worker its parent's); its synchronous calls run on the one event loop fsspec keeps in a
thread of each process (and makes anew after a fork), so the threads of storage/client.py's pool
share it and its aiobotocore connection pool, sized to the GETs in flight. cat_file gives the
object whole: its first byte is counted when the whole object has arrived.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from facebench.host.extras import Requirement

if TYPE_CHECKING:
    from facebench.storage.client import Endpoint

REQUIREMENT = Requirement("s3fs", "s3clients")


def options(endpoint: Endpoint) -> dict[str, Any]:
    """An S3FileSystem's options for this endpoint (a library that reads through s3fs itself,
    as Hugging Face datasets does, takes them as its storage_options)."""
    return {
        "endpoint_url": endpoint.address or None,
        "profile": endpoint.profile or None,
        "client_kwargs": {"region_name": endpoint.region},
        "config_kwargs": {
            "connect_timeout": 3,
            "read_timeout": 30,
            "max_pool_connections": max(endpoint.in_flight, 1),
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "s3": {"addressing_style": "path" if endpoint.path_style else "virtual"},
        },
        "skip_instance_cache": True,
        "use_listings_cache": False,
        # One GET an object: above 1, cat_file asks each object's size first (a HEAD) to
        # split large ones; the GETs in flight are storage/client.py's threads.
        "max_concurrency": 1,
    }


def make(endpoint: Endpoint) -> Any:
    import s3fs

    made = s3fs.S3FileSystem(**options(endpoint))
    made.retries = 1  # s3fs's own retries of what it deems transient: storage/client.py's own
    return made


def fetch(
    client: Any, bucket: str, key: str, byte_range: tuple[int, int] | None, start_ns: int
) -> tuple[bytes, int]:
    start, end = byte_range if byte_range is not None else (None, None)
    data = client.cat_file(f"{bucket}/{key}", start=start, end=end)
    return data, time.perf_counter_ns() - start_ns


def errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    # s3fs turns S3's answers into OSErrors (FileNotFoundError for NoSuchKey and NoSuchBucket,
    # PermissionError for AccessDenied), keeping the answer in the message.
    return (OSError, ClientError, BotoCoreError)
