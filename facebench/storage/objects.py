"""The few requests around the images: listing a prefix, small reads, uploads, deletes, through
boto3 (its paginator, transfer manager and errors are the reference); each process makes its own
client (facebench/storage/client.py), with the job's endpoint.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from facebench.errors import StorageError
from facebench.storage.address import Address, parse
from facebench.storage.client import Endpoint, configured, failure, make

PART_BYTES = 8 * 2**20  # put_file's multipart threshold and part size (boto3's defaults)
_LIST_PAGE = 1000  # ListObjectsV2's largest page
_PROGRESS_EVERY = 50  # pages (50,000 objects) between progress lines


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
        answer = make("boto").get_object(Bucket=address.bucket, Key=address.key)
        return answer["Body"].read()
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None


def get_with_headers(address: Address) -> tuple[bytes, dict[str, str]]:
    """An object whole, and the headers its GET answered with (names lower-cased, as boto3
    gives them)."""
    try:
        answer = make("boto").get_object(Bucket=address.bucket, Key=address.key)
        data = answer["Body"].read()
    except _boto_errors() as error:
        raise _boto_failure(str(address), error, configured()) from None
    return data, dict(answer["ResponseMetadata"]["HTTPHeaders"])


def head(url: str) -> dict[str, Any] | None:
    """An object's size, ETag and user metadata; None if there is none at the address."""
    address = parse(url)
    try:
        answer = make("boto").head_object(Bucket=address.bucket, Key=address.key)
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
    """Upload a local file (multipart, in PART_BYTES parts, where it is larger) with
    facebench's metadata."""
    from boto3.s3.transfer import TransferConfig

    address = parse(url)
    parts = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)
    try:
        make("boto").upload_file(
            path, address.bucket, address.key, ExtraArgs={"Metadata": metadata}, Config=parts
        )
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None
    except FileNotFoundError:
        raise StorageError(f"{path}: vanished before it was uploaded to {url}") from None


def put_requests(size: int) -> int:
    """The requests put_file bills for a file of `size` bytes: one PUT, or a multipart upload's
    start, its parts and its completion."""
    if size < PART_BYTES:
        return 1
    return 2 + -(-size // PART_BYTES)


def file_etag(path: str) -> str:
    """The ETag S3 gives the object put_file makes of this file: its MD5, or for a multipart
    upload the MD5 of its parts' MD5s and their count ("...-3"), so that a listing tells
    whether an object already holds the file."""
    digests = []
    with open(path, "rb") as file:
        for part in iter(lambda: file.read(PART_BYTES), b""):
            digests.append(hashlib.md5(part, usedforsecurity=False).digest())
    if os.path.getsize(path) < PART_BYTES:  # boto3 sends a file of the threshold in parts
        return (digests[0] if digests else hashlib.md5(b"", usedforsecurity=False).digest()).hex()
    whole = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return f"{whole}-{len(digests)}"


def put_bytes(url: str, data: bytes, metadata: dict[str, str]) -> None:
    address = parse(url)
    try:
        make("boto").put_object(
            Bucket=address.bucket, Key=address.key, Body=data, Metadata=metadata
        )
    except _boto_errors() as error:
        raise _boto_failure(url, error, configured()) from None


def delete(url: str) -> None:
    """Remove an object facebench wrote (its upload manifest, before the upload changes)."""
    address = parse(url)
    try:
        make("boto").delete_object(Bucket=address.bucket, Key=address.key)
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
    paginator = make("boto").get_paginator("list_objects_v2")
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
