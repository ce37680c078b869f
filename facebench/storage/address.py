"""s3:// addresses: a bucket and a key, as records and shard lists name objects.

A record's path is the object's whole address, s3://bucket/prefix/CelebA/.../000001.jpg, so that
every place that names a sample's file (errors, the skip list, the exactly-once check) names the
object the same way, and a reader tells an object from a local file by its scheme alone.
"""

from __future__ import annotations

from typing import NamedTuple

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
