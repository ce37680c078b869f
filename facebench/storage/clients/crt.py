"""AWS's CRT client, as s3torchconnector wraps it (storage.client=crt, the default).

Its native client is dropped before each fork and made again in the child (the library does
this), and it releases the GIL while it waits: the threads of storage/client.py's pool share one.
A range is read through the stream the library's ranged reader uses inside: the ranged reader
itself asks for the object's size first (a HEAD for every range), the stream does not (a private
method of s3torchconnector==1.5.0, as pinned).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from facebench.host.extras import Requirement

if TYPE_CHECKING:
    from facebench.storage.client import Endpoint

REQUIREMENT = Requirement("s3torchconnector", "s3")


def make(endpoint: Endpoint) -> Any:
    from s3torchconnector._s3client import S3Client, S3ClientConfig

    config = S3ClientConfig(
        force_path_style=endpoint.path_style, max_attempts=1, profile=endpoint.profile or None
    )
    return S3Client(endpoint.region, endpoint=endpoint.address or None, s3client_config=config)


def fetch(
    client: Any, bucket: str, key: str, byte_range: tuple[int, int] | None, start_ns: int
) -> tuple[bytes, int]:
    if byte_range is None:
        reader = client.get_object(bucket, key)
        first = reader.read(1)  # the first chunk arrives: the time to first byte
        first_byte = time.perf_counter_ns() - start_ns
        return first + reader.read(), first_byte
    chunks = iter(client._get_object_stream(bucket, key, *byte_range))
    first = next(chunks, b"")
    first_byte = time.perf_counter_ns() - start_ns
    return b"".join([first, *chunks]), first_byte


def errors() -> tuple[type[BaseException], ...]:
    from s3torchconnectorclient import S3Exception

    return (S3Exception,)
