"""obstore, Python's binding of the Rust object_store crate (storage.client=obstore).

One S3Store per bucket and process: its requests run on a tokio runtime of the process's own,
and the synchronous calls release the GIL while they wait, so the threads of storage/client.py's
pool share it. A runtime does not survive a fork: the store is made in each worker
(storage/client.py's per-process clients), and a worker forked from a process that had used
obstore refuses it in one line (storage/clients/__init__.py), where its first request would wait
forever. Credentials come through botocore's chain (obstore's boto3 provider), as for every
other client; plain http:// endpoints are allowed.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from facebench.host.extras import Requirement

if TYPE_CHECKING:
    from facebench.storage.client import Endpoint

FORK_SAFE = False  # its tokio runtime: storage/clients/__init__.py
REQUIREMENT = Requirement("obstore", "s3clients")


class _Stores:
    """One store per bucket (an S3Store is bound to its bucket)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.stores: dict[str, Any] = {}

    def store(self, bucket: str) -> Any:
        store = self.stores.get(bucket)
        if store is None:
            store = self.stores[bucket] = _store(self.endpoint, bucket)
        return store


def _store(endpoint: Endpoint, bucket: str) -> Any:
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider
    from obstore.store import S3Store

    address = endpoint.address or f"https://s3.{endpoint.region}.amazonaws.com"
    scheme, _, host = address.partition("://")
    # Virtual-host style: object_store wants the bucket in the endpoint itself.
    where = address if endpoint.path_style else f"{scheme}://{bucket}.{host}"
    session = boto3.session.Session(profile_name=endpoint.profile or None)
    return S3Store(
        bucket,
        endpoint=where.rstrip("/"),
        region=endpoint.region,
        virtual_hosted_style_request=not endpoint.path_style,
        credential_provider=Boto3CredentialProvider(session),
        client_options={
            "allow_http": True,
            "connect_timeout": timedelta(seconds=3),
            "timeout": timedelta(seconds=30),
        },
        retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=30)},
    )


def make(endpoint: Endpoint) -> Any:
    return _Stores(endpoint)


def fetch(
    client: Any, bucket: str, key: str, byte_range: tuple[int, int] | None, start_ns: int
) -> tuple[bytes, int]:
    import obstore

    options = {} if byte_range is None else {"range": byte_range}
    answer = obstore.get(client.store(bucket), key, options=options)
    first_byte = time.perf_counter_ns() - start_ns  # get returns once the head has arrived
    return answer.bytes().to_bytes(), first_byte


def errors() -> tuple[type[BaseException], ...]:
    from obstore.exceptions import BaseError

    # A missing object is Python's FileNotFoundError, a refusal its PermissionError; the
    # message holds the server's answer either way (with a debug dump, never shown).
    return (BaseError, OSError)
