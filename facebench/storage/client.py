"""Each image's GET from the bucket: the endpoint, this process's client, retries, and the one
line a failure ends in. (Listing, small reads and uploads: objects.py.)

Per-image GETs go through the client library storage.client names (storage/clients/: AWS's CRT
client by default, boto3, obstore, s3dlio, s3fs); each is told to try once, and this module
retries, counts and words failures the same way for all of them. On one core against the local
server, small objects, boto3 spent 1.2-1.5 ms of CPU per GET, the CRT client 0.47 ms and
obstore 0.3 ms (docs/benchmarks.md has every client). Listing, small reads and uploads are few
and go through boto3, whose paginator, transfer manager and errors are the reference.

Each process makes its own clients, when it first needs them: a client is never used across a
fork. The settings (Endpoint) are set once per job, before any worker is forked, and inherited.
Every retried attempt and every 503 SlowDown is counted, and an endpoint that does not answer
costs a bounded wait: `attempts` tries, a connect timeout each.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from facebench.errors import ObjectMissing, StorageError
from facebench.storage import clients
from facebench.storage.address import parse, path_style

log = logging.getLogger(__name__)

_BACKOFF_S = 0.1  # before the first retry; doubled before each next one


@dataclass(frozen=True)
class Endpoint:
    """Where the bucket answers and how to ask it (a job's storage.* keys, credentials aside)."""

    endpoint: str = ""  # empty: AWS's own
    region: str = "us-east-1"
    path_style: bool = False  # resolved: True for endpoint/bucket/key
    profile: str = ""
    attempts: int = 3
    in_flight: int = 8  # GETs a process keeps in flight when it reads many objects at once
    # The relay that emulates the bucket's distance (storage/distance.py), where one runs: the
    # clients connect to it; messages and tags still name the endpoint.
    via: str = ""
    client: str = "crt"  # storage.client: the library each GET goes through (storage/clients/)

    @classmethod
    def of(cls, storage: Any, via: str = "") -> Endpoint:
        """A job's endpoint from its storage.* keys, its addressing resolved once (address.py
        path_style) for every client it makes or hands to a library."""
        endpoint, bucket = str(storage.endpoint), parse(str(storage.url)).bucket
        return cls(
            endpoint, str(storage.region), path_style(endpoint, bucket, storage.path_style, via),
            str(storage.profile), int(storage.attempts), int(storage.requests_per_worker), via,
            str(getattr(storage, "client", "crt")),
        )  # fmt: skip

    @property
    def address(self) -> str:
        """Where the clients connect: the relay, or the endpoint (empty: AWS's own)."""
        return self.via or self.endpoint

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


def make(kind: str) -> Any:
    """This process's client of a kind: `get` (each image's GET, through storage.client's
    library) or `boto` (objects.py)."""
    endpoint = configured()
    if kind == "boto":
        return _per_process(kind, lambda: _boto(endpoint))
    return _per_process(kind, lambda: clients.make(endpoint.client, endpoint))


def _per_process(kind: str, build: Callable[[], Any]) -> Any:
    """One `kind` of thing for this process, built on first use: a forked worker builds its
    own (a client's connections and a pool's threads do not survive a fork)."""
    key = (os.getpid(), kind)
    made = _clients.get(key)
    if made is None:
        with _lock:
            made = _clients.get(key)
            if made is None:
                made = _clients[key] = build()
    return made


def _boto(endpoint: Endpoint) -> Any:
    import boto3

    session = boto3.session.Session(profile_name=endpoint.profile or None)
    return session.client("s3", **boto_options(endpoint))


def boto_options(
    endpoint: Endpoint, attempts: int | None = None, connections: int = 32
) -> dict[str, Any]:
    """A boto3 S3 client's options for this endpoint (a library that makes its own client, as
    LitData does, takes them too): its address and addressing, bounded waits and retries
    (`attempts`, storage.attempts by default), and its pool of connections (32 by default: the
    upload's threads, each with its connection)."""
    from botocore.config import Config

    config = Config(
        region_name=endpoint.region,
        connect_timeout=3,
        max_pool_connections=connections,
        read_timeout=30,
        # total_max_attempts counts the first try; botocore's max_attempts would not.
        retries={
            "total_max_attempts": endpoint.attempts if attempts is None else attempts,
            "mode": "standard",
        },
        s3={"addressing_style": "path" if endpoint.path_style else "virtual"},
    )
    return {"endpoint_url": endpoint.address or None, "config": config}


# What the CRT client's and S3's messages say, in lower case -> the kind of failure.
_KINDS = (
    ("key does not exist", "missing"),
    ("nosuchkey", "missing"),
    ("bucket does not exist", "no bucket"),
    ("nosuchbucket", "no bucket"),
    ("slowdown", "throttled"),
    ("slow down", "throttled"),
    ("reduce your request rate", "throttled"),
    # A 503 as a status, not any "503" in a message (a dump's request id or elapsed time).
    *((status, "throttled") for status in ("status: 503", "status 503", "503 service", "(503)")),
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
        return ObjectMissing(
            f"{url}: no such object ({detail}; it was listed, or named by the labels). "
            "Restore it, or upload the data again: python prepare.py storage=s3 ..."
        )
    if kind == "no bucket":
        # Addressed as bucket.host, a server that takes only host/bucket reads the key's first
        # folder as the bucket: its NoSuchBucket is then about the addressing.
        addressing = (
            "" if endpoint.path_style else ", or address it by path: storage.path_style=true"
        )
        return StorageError(
            f"s3://{address.bucket}: no such bucket at {endpoint.host} (asked for {url}: "
            f"{detail}). Check storage.url{addressing}, or create the bucket"
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


def failed(url: str, error: BaseException) -> StorageError:
    """The one line for a fetch of `url` that failed in a library that fetches for itself
    (LitData's downloads: boto3, or obstore, whose message is a debug dump of the answer)."""
    message = str(error)
    return failure(url, _kind(message), _answer(message, error), configured())


def _answer(message: str, error: BaseException) -> str:
    """The server's answer, as its error code, or the message's first line (never a dump)."""
    code = _CODE.search(message)
    lines = message.strip().splitlines()
    return code.group(1) if code else (lines[0][:200] if lines else type(error).__name__)


_CODE = re.compile(r"<Code>([^<]+)</Code>")  # an S3 error document's code: NoSuchKey, ...


def get(url: str, byte_range: tuple[int, int] | None = None) -> Reply:
    """One object, whole (or the bytes [start, end) of it: a range GET), with what the GET
    cost; retried where S3 says to retry."""
    endpoint = configured()
    library = clients.module(endpoint.client)
    address = parse(url)
    made = make("get")
    retries = throttled = 0
    for attempt in range(endpoint.attempts):
        start = time.perf_counter_ns()
        try:
            data, first_byte = library.fetch(made, address.bucket, address.key, byte_range, start)
            return Reply(data, time.perf_counter_ns() - start, first_byte, retries, throttled)
        except library.errors() as error:
            message = _message(error)
            kind = _kind(message)
            throttled += kind == "throttled"
            if kind in ("throttled", "unreachable") and attempt + 1 < endpoint.attempts:
                retries += 1
                time.sleep(_BACKOFF_S * 2**attempt)
                continue
            answer = f"{_answer(message, error)}, through storage.client={endpoint.client}"
            raise failure(url, kind, answer, endpoint) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def _message(error: BaseException) -> str:
    """What a client's error says, its S3 error code included (boto3 keeps it in the response,
    and a missing object may be only a FileNotFoundError's type)."""
    response = getattr(error, "response", None)
    code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
    text = str(error)
    gone = isinstance(error, FileNotFoundError) and "bucket" not in text.lower()
    missing = "NoSuchKey" if gone else ""
    return " ".join(part for part in (code, text, missing) if part)


def get_ranges(url: str, byte_ranges: Sequence[tuple[int, int]]) -> list[Reply]:
    """Several ranges of one object, in order, `in_flight` at once as get_many."""
    in_flight = configured().in_flight
    if in_flight <= 1 or len(byte_ranges) <= 1:
        return [get(url, byte_range) for byte_range in byte_ranges]
    return list(_pool(in_flight).map(lambda byte_range: get(url, byte_range), byte_ranges))


def get_many(urls: Sequence[str]) -> list[Reply]:
    """Several objects, in order, with up to `in_flight` GETs at once from this process's pool of
    threads (the CRT client releases the GIL while it waits)."""
    in_flight = configured().in_flight
    if in_flight <= 1 or len(urls) <= 1:
        return [get(url) for url in urls]
    return list(_pool(in_flight).map(get, urls))


def _pool(size: int) -> ThreadPoolExecutor:
    return _per_process(
        "pool", lambda: ThreadPoolExecutor(size, thread_name_prefix="facebench-get")
    )
