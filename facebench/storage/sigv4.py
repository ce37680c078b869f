"""AWS Signature Version 4, checked: whether a request was signed with a secret the relay
knows, so that the relay answers from its copy of a bucket only what the bucket itself would
answer (facebench/storage/relay.py; a request it cannot check goes to the endpoint, whose
answer, SignatureDoesNotMatch and the rest, the client then receives as it would).

The canonical request, the string to sign and the signing key follow AWS's "Create a signed
AWS API request" (Signature Version 4) for S3: the path as sent (S3 signs it encoded once, not
normalized), the query's names and values encoded and sorted, the signed headers lower-cased
with their values trimmed, and the payload's hash as x-amz-content-sha256 states it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
# How far a request's x-amz-date may be from the relay's clock: S3 refuses a request more than
# 15 minutes off (RequestTimeTooSkewed), so the relay sends such a one on to say so.
MAX_SKEW = timedelta(minutes=15)


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_query(query: str) -> str:
    """The query's names and values, each decoded then encoded AWS's way, sorted."""
    pairs = []
    for part in query.split("&") if query else []:
        name, _, value = part.partition("=")
        pairs.append((_encode(unquote(name)), _encode(unquote(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _authorization(value: str) -> dict[str, str] | None:
    """'AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...' as a dict."""
    algorithm, _, rest = value.partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields = {}
    for part in rest.split(","):
        name, _, field = part.strip().partition("=")
        fields[name] = field
    needed = ("Credential", "SignedHeaders", "Signature")
    return fields if all(name in fields for name in needed) else None


def access_key(headers: Mapping[str, Sequence[str]]) -> str | None:
    """The access key a request names in its Authorization header, if it is signed with V4."""
    found = _authorization(_one(headers, "authorization"))
    return found["Credential"].split("/", 1)[0] if found else None


def verify(
    method: str,
    target: str,
    headers: Mapping[str, Sequence[str]],
    secrets: Mapping[str, str],
    now: datetime | None = None,
) -> bool:
    """Whether the request (its method, request target and headers, names lower-cased, each
    name's values in order) carries a valid V4 signature by one of `secrets` (access key ->
    secret key), dated within MAX_SKEW of now."""
    found = _authorization(_one(headers, "authorization"))
    if found is None:
        return False
    key, _, scope = found["Credential"].partition("/")
    secret = secrets.get(key)
    date = _one(headers, "x-amz-date")
    payload = _one(headers, "x-amz-content-sha256")
    if secret is None or not date or not payload or scope.count("/") != 3:
        return False
    try:
        stamp = datetime.strptime(date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return False
    if abs((now or datetime.now(UTC)) - stamp) > MAX_SKEW or not scope.startswith(date[:8]):
        return False
    signed = found["SignedHeaders"].split(";")
    if "host" not in signed or any(name not in headers for name in signed):
        return False
    path, _, query = target.partition("?")
    canonical = "\n".join(
        [
            method,
            path,
            canonical_query(query),
            "".join(f"{name}:{_trimmed(headers[name])}\n" for name in signed),
            found["SignedHeaders"],
            payload,
        ]
    )
    to_sign = "\n".join([ALGORITHM, date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _signing_key(secret, *scope.split("/")[:3])
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, found["Signature"])


@functools.lru_cache(maxsize=64)
def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    """The key a day's requests are signed with: the same for all of them, made once."""
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _one(headers: Mapping[str, Sequence[str]], name: str) -> str:
    values = headers.get(name)
    return values[0] if values else ""


def _trimmed(values: Sequence[str]) -> str:
    """A header's values as V4 canonicalizes them: each trimmed, inner runs of spaces made one,
    several joined by commas."""
    return ",".join(" ".join(value.split()) for value in values)
