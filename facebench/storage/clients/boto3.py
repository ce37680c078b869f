"""boto3, the AWS SDK for Python (storage.client=boto3): the client most code already uses.

One client per process, thread-safe, its connection pool sized to the GETs the process keeps in
flight (storage.requests_per_worker) so that no thread waits for a connection. get_object returns
when the answer's head has arrived; its body is read after: that return is the first byte.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from facebench.host.extras import Requirement

if TYPE_CHECKING:
    from facebench.storage.client import Endpoint

REQUIREMENT = Requirement("boto3", "s3")


def make(endpoint: Endpoint) -> Any:
    import boto3

    from facebench.storage.client import boto_options

    options = boto_options(endpoint, attempts=1, connections=max(endpoint.in_flight, 1))
    session = boto3.session.Session(profile_name=endpoint.profile or None)
    return session.client("s3", **options)


def fetch(
    client: Any, bucket: str, key: str, byte_range: tuple[int, int] | None, start_ns: int
) -> tuple[bytes, int]:
    asked = {} if byte_range is None else {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
    answer = client.get_object(Bucket=bucket, Key=key, **asked)
    first_byte = time.perf_counter_ns() - start_ns
    body = answer["Body"]
    try:
        return body.read(), first_byte
    finally:
        body.close()


def errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError)
