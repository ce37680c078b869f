"""Talking to the bucket: each image's GET, and the listing, labels and uploads around them.

Per-image GETs go through AWS's CRT client (s3torchconnector's S3Client: the client users reach
for first). Two were measured on one core against the local server, small objects: boto3 spent
1.2-1.5 ms of CPU per GET, the CRT client 0.47 ms, and obstore 0.3 ms; obstore (Rust, tokio)
hangs any process forked after its first use, and DataLoader's workers are forked, so the CRT
client, which its library hands over across a fork (it drops its native client before each fork
and makes a new one in the child), is the one loaders use. Listing, small reads and uploads are
few and go through boto3, whose paginator, transfer manager and errors are the reference.

Each process makes its own clients, when it first needs them: a client is never used across a
fork. The settings (Endpoint) are set once per job, before any worker is forked, and inherited.
Retries are this module's own (the CRT client is told to try once), so that every retried
attempt and every 503 SlowDown is counted, and an endpoint that does not answer costs a bounded
wait: `attempts` tries, a connect timeout each.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from facebench.errors import StorageError
from facebench.storage.address import Address, parse

log = logging.getLogger(__name__)

_BACKOFF_S = 0.1  # before the first retry; doubled before each next one
_LIST_PAGE = 1000  # ListObjectsV2's largest page
_PROGRESS_EVERY = 50  # pages (50,000 objects) between progress lines


@dataclass(frozen=True)
class Endpoint:
    """Where the bucket answers and how to ask it (a job's storage.* keys, credentials aside)."""

    endpoint: str = ""  # empty: AWS's own
    region: str = "us-east-1"
    path_style: bool = False
    profile: str = ""
    attempts: int = 3
    in_flight: int = 8  # GETs a process keeps in flight when it reads many objects at once

    @classmethod
    def of(cls, storage: Any) -> Endpoint:
        return cls(
            str(storage.endpoint), str(storage.region), bool(storage.path_style),
            str(storage.profile), int(storage.attempts), int(storage.requests_per_worker),
        )  # fmt: skip

    @property
    def host(self) -> str:
        """The endpoint's host and port, for tags and messages (AWS's: s3.<region>)."""
        return (
            urlsplit(self.endpoint).netloc if self.endpoint else f"s3.{self.region}.amazonaws.com"
        )


class Reply(NamedTuple):
    """One GET: the object's bytes, its latency and first byte (ns), retried attempts, 503s."""

    data: bytes
    latency_ns: int
    first_byte_ns: int
    retries: int
    throttled: int


_endpoint: Endpoint | None = None
_clients: dict[tuple[int, str], Any] = {}  # (pid, kind) -> client
_lock = threading.Lock()


def configure(endpoint: Endpoint | None) -> None:
    """The endpoint s3:// paths are read from in this process and the workers it forks (the
    clients made for another are dropped: a sweep's jobs may name different ones)."""
    global _endpoint
    if endpoint != _endpoint:
        with _lock:
            _clients.clear()
    _endpoint = endpoint


def configured() -> Endpoint:
    if _endpoint is None:
        raise StorageError(
            "an s3:// path was read with storage=local: run with storage=s3 and its keys"
        )
    return _endpoint


def _client(kind: str) -> Any:
    key = (os.getpid(), kind)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = (_crt if kind == "crt" else _boto)(configured())
    return client


def _crt(endpoint: Endpoint) -> Any:
    from s3torchconnector._s3client import S3Client, S3ClientConfig

    config = S3ClientConfig(
        force_path_style=endpoint.path_style, max_attempts=1, profile=endpoint.profile or None
    )
    return S3Client(endpoint.region, endpoint=endpoint.endpoint or None, s3client_config=config)


def _boto(endpoint: Endpoint) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=endpoint.region,
        connect_timeout=3,
        max_pool_connections=32,  # the upload's threads, each with its connection
        read_timeout=30,
        retries={"max_attempts": endpoint.attempts, "mode": "standard"},
        s3={"addressing_style": "path" if endpoint.path_style else "virtual"},
    )
    session = boto3.session.Session(profile_name=endpoint.profile or None)
    return session.client("s3", endpoint_url=endpoint.endpoint or None, config=config)


# What the CRT client's and S3's messages say, in lower case -> the kind of failure.
_KINDS = (
    ("key does not exist", "missing"),
    ("nosuchkey", "missing"),
    ("bucket does not exist", "no bucket"),
    ("nosuchbucket", "no bucket"),
    ("slowdown", "throttled"),
    ("slow down", "throttled"),
    ("reduce your request rate", "throttled"),
    ("503", "throttled"),
    ("forbidden", "refused"),
    ("access denied", "refused"),
    ("accessdenied", "refused"),
    ("signature", "refused"),
    ("invalidaccesskeyid", "refused"),
)


def _kind(message: str) -> str:
    lowered = message.lower()
    return next((kind for text, kind in _KINDS if text in lowered), "unreachable")


def failure(url: str, kind: str, detail: str, endpoint: Endpoint) -> StorageError:
    """The one line for a request that failed, naming the object or endpoint and what to do."""
    address = parse(url)
    if kind == "missing":
        return StorageError(
            f"{url}: no such object (it was listed, or named by the labels). Restore it, or "
            "upload the data again: python prepare.py storage=s3 ..."
        )
    if kind == "no bucket":
        return StorageError(
            f"s3://{address.bucket}: no such bucket at {endpoint.host}. Check storage.url, or "
            "create the bucket"
        )
    if kind == "refused":
        return StorageError(
            f"{endpoint.host} refused the credentials for {url} ({detail}). Check "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or storage.profile"
        )
    if kind == "throttled":
        return StorageError(
            f"{url}: {endpoint.host} answered 503 SlowDown to all {endpoint.attempts} attempts: "
            "more requests a second than it allows on this prefix. Lower n_workers or "
            "storage.requests_per_worker, or raise storage.attempts"
        )
    return StorageError(
        f"{endpoint.host} did not answer for {url} after {endpoint.attempts} attempts "
        f"({detail}). Is the endpoint right, and the server running? (the local one: python -m "
        "facebench.storage.server status)"
    )


def get(url: str) -> Reply:
    """One object, whole, with what the GET cost; retried where S3 says to retry."""
    from s3torchconnectorclient import S3Exception

    endpoint = configured()
    address = parse(url)
    client = _client("crt")
    retries = throttled = 0
    for attempt in range(endpoint.attempts):
        start = time.perf_counter_ns()
        try:
            reader = client.get_object(address.bucket, address.key)
            first = reader.read(1)  # the first chunk arrives: the time to first byte
            first_byte = time.perf_counter_ns() - start
            data = first + reader.read()
            return Reply(data, time.perf_counter_ns() - start, first_byte, retries, throttled)
        except S3Exception as error:
            kind = _kind(str(error))
            throttled += kind == "throttled"
            if kind in ("throttled", "unreachable") and attempt + 1 < endpoint.attempts:
                retries += 1
                time.sleep(_BACKOFF_S * 2**attempt)
                continue
            raise failure(url, kind, str(error).splitlines()[0], endpoint) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def get_many(urls: Sequence[str]) -> list[Reply]:
    """Several objects, in order, with up to `in_flight` GETs at once from this process's pool of
    threads (the CRT client releases the GIL while it waits)."""
    in_flight = configured().in_flight
    if in_flight <= 1 or len(urls) <= 1:
        return [get(url) for url in urls]
    return list(_pool(in_flight).map(get, urls))


def _pool(size: int) -> ThreadPoolExecutor:
    key = (os.getpid(), "pool")
    pool = _clients.get(key)
    if pool is None:
        with _lock:
            pool = _clients.get(key)
            if pool is None:
                pool = _clients[key] = ThreadPoolExecutor(size, thread_name_prefix="facebench-get")
    return pool


def _boto_failure(url: str, error: Exception, endpoint: Endpoint) -> StorageError:
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    message = str(response.get("Error", {}).get("Message", "")) or str(error)
    detail = f"{code or type(error).__name__}: {message}".splitlines()[0]
    if code in ("404", "NoSuchKey", "NotFound"):
        return failure(url, "missing", detail, endpoint)
    if code == "NoSuchBucket":
        return failure(url, "no bucket", detail, endpoint)
    if status == "403" or code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId"):
        return failure(url, "refused", detail, endpoint)
    if status == "503" or code == "SlowDown":
        return failure(url, "throttled", detail, endpoint)
    return failure(url, "unreachable", detail, endpoint)


def _boto_errors() -> tuple[type[Exception], ...]:
    import botocore.exceptions

    return (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


def read(url: str) -> bytes:
    """A small object whole (a labels file), outside any epoch."""
    address = parse(url)
    try:
        answer = _client("boto").get_object(Bucket=address.bucket, Key=address.key)
        return answer["Body"].read()
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None


def head(url: str) -> dict[str, Any] | None:
    """An object's size, ETag and user metadata; None if there is none at the address."""
    address = parse(url)
    try:
        answer = _client("boto").head_object(Bucket=address.bucket, Key=address.key)
    except _boto_errors() as error:
        code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NotFound"):
            return None
        raise _boto_failure(url, error, configured()) from None
    return {
        "size": int(answer["ContentLength"]),
        "etag": str(answer.get("ETag", "")).strip('"'),
        "metadata": dict(answer.get("Metadata", {})),
    }


def put_file(url: str, path: str, metadata: dict[str, str]) -> None:
    """Upload a local file (multipart where it is large) with facebench's metadata."""
    address = parse(url)
    try:
        _client("boto").upload_file(
            path, address.bucket, address.key, ExtraArgs={"Metadata": metadata}
        )
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None
    except FileNotFoundError:
        raise StorageError(f"{path}: vanished before it was uploaded to {url}") from None


def put_bytes(url: str, data: bytes, metadata: dict[str, str]) -> None:
    address = parse(url)
    try:
        _client("boto").put_object(
            Bucket=address.bucket, Key=address.key, Body=data, Metadata=metadata
        )
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None


def delete(url: str) -> None:
    """Remove an object facebench wrote (its upload manifest, before the upload changes)."""
    address = parse(url)
    try:
        _client("boto").delete_object(Bucket=address.bucket, Key=address.key)
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None


class Listed(NamedTuple):
    key: str  # relative to the listed prefix
    size: int
    etag: str


def list_objects(address: Address, progress_log: logging.Logger | None = None) -> Iterator[Listed]:
    """Every object under the address's prefix, in key order (ListObjectsV2, 1,000 a page),
    with a progress line every 50 pages."""
    prefix = address.prefix
    paginator = _client("boto").get_paginator("list_objects_v2")
    pages = paginator.paginate(
        Bucket=address.bucket, Prefix=prefix, PaginationConfig={"PageSize": _LIST_PAGE}
    )
    count = 0
    started = time.monotonic()
    try:
        for number, page in enumerate(pages, start=1):
            for entry in page.get("Contents", ()):
                count += 1
                yield Listed(
                    entry["Key"][len(prefix) :], int(entry["Size"]), entry["ETag"].strip('"')
                )
            if progress_log is not None and number % _PROGRESS_EVERY == 0:
                rate = count / max(time.monotonic() - started, 1e-9)
                progress_log.info("listing %s: %d objects so far (%.0f/s)", address, count, rate)
    except _boto_errors() as error:
        raise _boto_failure(str(address), error, configured()) from None
