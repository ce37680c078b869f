"""What the relay answers from its copy of the bucket (bucket_copy.py) rather than the endpoint:
an object's GET (whole, or one byte range) and HEAD, and a listing the endpoint has already
answered once (ListObjectsV2 pages, kept by their request target).

Only what the copy answers exactly as the bucket would: a request whose V4 signature checks out
(sigv4.py) against the job's own credentials, path-style (every client the job makes addresses
the relay so), with no condition (If-Match and the like), version or part. Anything else (an
unknown key or a wrong signature, an object not in the copy, several ranges, an upload) goes to
the endpoint, and its answer, errors included, is the client's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from facebench.storage.bucket_copy import BucketCopy
from facebench.storage.relay_http import made_headers
from facebench.storage.sigv4 import verify

# Query parameters a plain GET may carry (botocore names the operation: ?x-id=GetObject).
_PLAIN = frozenset({"x-id"})
# Conditions left to the endpoint: those on dates (the copy keeps Last-Modified as text).
_CONDITIONS = ("if-modified-since", "if-unmodified-since")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_READS = (b"GET", b"HEAD")
_CHECKSUM = "x-amz-checksum-"


@dataclass(frozen=True)
class Answer:
    """A response the relay makes: status, reason, headers, and its body: bytes, or a span of
    an open file to send from (fd, start, stop; the sender closes it), or none (a HEAD's)."""

    status: int
    reason: str
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    span: tuple[int, int, int] | None = None


class CopyAnswers:
    """The copy and the listings seen, with the credentials requests must be signed with."""

    def __init__(self, copy: BucketCopy, secrets: Mapping[str, str]) -> None:
        self.copy = copy
        self.secrets = dict(secrets)
        self.listings: dict[bytes, tuple[list[tuple[bytes, bytes]], bytes]] = {}

    def answer(
        self, method: bytes, target: bytes, headers: Mapping[str, Sequence[str]]
    ) -> Answer | None:
        """The copy's answer to this request, or None: the endpoint's to give."""
        if method not in _READS or any(name in headers for name in _CONDITIONS):
            return None
        text = target.decode("latin-1")
        path, _, query = text.partition("?")
        names = {part.partition("=")[0] for part in query.split("&") if part}
        if "list-type" in names:
            listing = self.listings.get(target) if method == b"GET" else None
            if listing is None or not self._signed(method, text, headers):
                return None
            kept, body = listing
            return Answer(200, "OK", made_headers([]) + kept, body)
        bucket, _, key = unquote(path).lstrip("/").partition("/")
        entry = self.copy.find(bucket, key) if key and names <= _PLAIN else None
        if entry is None or not _met(headers, entry.etag):
            return None
        if not self._signed(method, text, headers):
            return None
        span = _span(headers.get("range"), entry.size)
        if span is None:
            return None
        start, stop = span
        fd = self.copy.open(entry)
        if fd is None:  # its file went with another job's refresh
            return None
        if method != b"GET":
            os.close(fd)
        kept = [(name, value) for name, value in entry.headers if name != "content-length"]
        if "range" in headers:
            # A part's answer: its own span, and no checksum of the whole (S3 gives none).
            kept = [(name, value) for name, value in kept if not name.startswith(_CHECKSUM)]
            kept += [("content-range", f"bytes {start}-{stop - 1}/{entry.size}")]
        kept += [("content-length", str(stop - start))]
        status, reason = (206, "Partial Content") if "range" in headers else (200, "OK")
        if method != b"GET":
            return Answer(status, reason, made_headers(kept), None)
        return Answer(status, reason, made_headers(kept), b"", (fd, start, stop))

    def keep_listing(
        self, target: bytes, headers: Mapping[str, Sequence[str]], status: int,
        answer_headers: list[tuple[bytes, bytes]], body: bytes,
    ) -> None:  # fmt: skip
        """A listing the endpoint answered (200) to a request signed with the job's keys: the
        next identical request is answered from it."""
        if status == 200 and self._signed(b"GET", target.decode("latin-1"), headers):
            own = {b"date", b"x-amz-request-id", b"x-amz-id-2", b"x-trans-id", b"connection"}
            kept = [(name, value) for name, value in answer_headers if name.lower() not in own]
            self.listings[target] = (kept, body)

    def forget(self, target: bytes) -> None:
        """A write went to the endpoint: the object it names and every listing are stale."""
        bucket, _, key = (
            unquote(target.decode("latin-1").partition("?")[0]).lstrip("/").partition("/")
        )
        self.copy.entries.pop(f"{bucket}/{key}", None)
        self.listings.clear()

    def _signed(self, method: bytes, target: str, headers: Mapping[str, Sequence[str]]) -> bool:
        return verify(method.decode(), target, headers, self.secrets)


def _met(headers: Mapping[str, Sequence[str]], etag: str) -> bool:
    """Whether the copy may answer under the request's ETag conditions: an If-Match that names
    its ETag (the CRT client asks so for each part of a large object after the first), and an
    If-None-Match that does not. Otherwise the endpoint answers (412, 304) as it does."""

    def named(values: Sequence[str]) -> set[str]:
        return {tag.strip().removeprefix("W/").strip('"') for value in values
                for tag in value.split(",")}  # fmt: skip

    if "if-match" in headers and not named(headers["if-match"]) & {etag, "*"}:
        return False
    return "if-none-match" not in headers or not named(headers["if-none-match"]) & {etag, "*"}


def _span(asked: Sequence[str] | None, size: int) -> tuple[int, int] | None:
    """The bytes [start, stop) a Range header asks for (the whole object without one); None
    for what the copy leaves to the endpoint: several ranges, or one it could not satisfy."""
    if not asked:
        return 0, size
    if len(asked) != 1:
        return None
    found = _RANGE.match(asked[0].strip())
    if found is None:
        return None
    first, last = found.groups()
    if first and (not last or int(last) >= int(first)):
        start, stop = int(first), min(size, int(last) + 1 if last else size)
    elif not first and last and int(last) > 0:
        start, stop = max(0, size - int(last)), size
    else:
        return None
    return (start, stop) if start < size else None
