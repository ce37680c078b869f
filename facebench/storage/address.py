"""s3:// addresses: a bucket and a key, as records and shard lists name objects.

A record's path is the object's whole address, s3://bucket/prefix/CelebA/.../000001.jpg, so that
every place that names a sample's file (errors, the skip list, the exactly-once check) names the
object the same way, and a reader tells an object from a local file by its scheme alone.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple
from urllib.parse import urlsplit

SCHEME = "s3://"


class Address(NamedTuple):
    bucket: str
    key: str  # no leading slash; a prefix ends with one unless it is empty

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    def child(self, *parts: str) -> Address:
        """The address of a key below this prefix."""
        key = "/".join(part.strip("/") for part in (self.key, *parts) if part.strip("/"))
        return Address(self.bucket, key)

    @property
    def prefix(self) -> str:
        """The key as a listing prefix: empty, or ending with a slash."""
        return f"{self.key.rstrip('/')}/" if self.key.strip("/") else ""


def in_bucket(path: str) -> bool:
    """Whether a sample's path names an object rather than a local file."""
    return path.startswith(SCHEME)


def parse(url: str) -> Address:
    """s3://bucket/some/key -> Address("bucket", "some/key") (the config checked its form)."""
    if not in_bucket(url):
        raise ValueError(f"{url}: not an s3:// address")
    bucket, _, key = url[len(SCHEME) :].partition("/")
    return Address(bucket, key.strip("/"))


# A bucket name that can lead a host name (botocore's test): 3-63 lower-case letters, digits and
# hyphens, not an IP address. Dots split it into several labels, which only plain http:// can
# take (an https certificate for *.host covers one label).
_HOST_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def path_style(endpoint: str, bucket: str, asked: bool | None = None, via: str = "") -> bool:
    """Whether clients address `bucket` at `endpoint` as endpoint/bucket/key (path style) rather
    than bucket.endpoint/key (virtual host): `asked` (storage.path_style) where given; else as
    boto3 chooses, so that every client reads the same bucket. Path style for an endpoint that
    is an IP address or localhost (no DNS name to put a bucket in), or a bucket name that
    cannot be a host name there; virtual host for AWS's own endpoint and other host names.
    Clients that connect to the distance relay (`via`, an IP address) use path style: the relay
    passes each request on unchanged."""
    if via:
        return True
    if asked is not None:
        return asked
    parts = urlsplit(endpoint) if endpoint else None
    host = (parts.hostname or "") if parts else ""
    if host == "localhost" or host.endswith(".localhost") or _is_ip(host):
        return True
    plain_http = parts is not None and parts.scheme == "http"
    labels = bucket.split(".") if plain_http else [bucket]
    hostable = 3 <= len(bucket) <= 63 and all(_HOST_LABEL.match(label) for label in labels)
    return _is_ip(bucket) or not hostable


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
