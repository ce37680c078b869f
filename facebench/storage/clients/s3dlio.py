"""s3dlio, a Rust S3 library made for AI/ML loading (storage.client=s3dlio), the client MLPerf
Storage's object mode runs beside s3torchconnector.

Its S3 client is one per process, made on its first request from configure_s3's endpoint and
region and the environment's credentials, and kept for the whole process (it cannot be
reconfigured). make() sets them from the job's endpoint and botocore's chain before that first
request, and refuses, in one line, a later job of the same process that names another endpoint
or other keys (a sweep's jobs each start a relay of their own). It addresses a custom endpoint
by path and AWS's own by host, whatever storage.path_style says: a custom endpoint addressed by
host is refused. Its client lives on a tokio runtime of the process's own (FORK_SAFE). It gives
each object whole: its first byte is counted when the object has arrived. Wheels: CPython 3.11.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from facebench.errors import ConfigError, StorageError
from facebench.host.extras import Requirement

if TYPE_CHECKING:
    from facebench.storage.client import Endpoint

FORK_SAFE = False  # its tokio runtime: storage/clients/__init__.py
REQUIREMENT = Requirement("s3dlio", "s3clients")

_made_for: tuple[str, str, str] | None = None  # (address, region, keys' digest) of this process
_made_in = 0  # the process that made it (a forked child starts with none)


def refusal(endpoint: Endpoint | None = None) -> None:
    """Refuse it, in one line, where no wheel of it installs, or where it would address the
    bucket otherwise than the job says."""
    if sys.version_info[:2] != (3, 11):
        raise ConfigError(
            "storage.client=s3dlio: s3dlio publishes wheels for CPython 3.11 only, and this is "
            f"Python {sys.version_info[0]}.{sys.version_info[1]}: choose another client "
            "(crt, boto3, obstore, fsspec), or run facebench under Python 3.11"
        )
    if endpoint is not None and endpoint.endpoint and not endpoint.path_style:
        raise ConfigError(
            f"storage.client=s3dlio addresses {endpoint.host} by path only, and this job "
            "addresses it by host (storage.path_style): set storage.path_style=true, or choose "
            "another client"
        )


def make(endpoint: Endpoint) -> Any:
    global _made_for, _made_in
    refusal(endpoint)
    from facebench.storage.credentials import keys

    found = keys(endpoint.profile)
    digest = hashlib.sha256(repr(sorted(found.items())).encode()).hexdigest()
    wanted = (endpoint.address, endpoint.region, digest)
    if _made_in == os.getpid() and _made_for != wanted:
        raise StorageError(
            f"storage.client=s3dlio: this process already read through s3dlio from "
            f"{_made_for[0] if _made_for else '?'} (or with other credentials), and s3dlio keeps "
            "its first endpoint and keys for the whole process. Run each job in a process of "
            "its own, or use another client for this sweep"
        )
    os.environ.update(found)
    import s3dlio

    s3dlio.configure_s3(endpoint_url=endpoint.address or None, region=endpoint.region)
    _made_for, _made_in = wanted, os.getpid()
    return s3dlio


def fetch(
    client: Any, bucket: str, key: str, byte_range: tuple[int, int] | None, start_ns: int
) -> tuple[bytes, int]:
    uri = f"s3://{bucket}/{key}"
    if byte_range is None:
        # One GET from its start to its end: s3dlio's get() asks each object's size first
        # (a HEAD per object a process reads: two requests an image), its get_range does not.
        data = client.get_range(uri, 0, None)
    else:
        data = client.get_range(uri, byte_range[0], byte_range[1] - byte_range[0])
    return bytes(data), time.perf_counter_ns() - start_ns


def errors() -> tuple[type[BaseException], ...]:
    # Its failed requests are RuntimeErrors whose text holds S3's answer ("service error:
    # NoSuchKey ..."), or OSErrors (a missing object, in some calls).
    return (RuntimeError, OSError)
