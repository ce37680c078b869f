"""The emulated bucket's copy of its objects: what the relay answers GETs, HEADs and ranges from,
so that the server on this machine costs nothing in the timed path, as a real bucket's servers
cost the host nothing (facebench/storage/relay.py).

    copy = refresh(Address("facebench", "data/"), folder)    # in the job, before any epoch
    # python -m facebench.storage.relay ... --copy=folder      # the relay loads its index

The endpoint stays the source of truth. The copy is taken through it, once, before timing
starts: every object under the job's prefix (its data and the shard sets beside them), each
fetched whole with a GET whose response's headers are kept with it. It lives on local disk,
not in the relay's memory (the page cache keeps what is read often), and is kept between runs:
each refresh lists the prefix and fetches again only what is new or whose ETag changed (a new
upload), and forgets what is gone, so that no stale byte is ever served. An object's file is
named by its key and ETag: a changed object gets a new file, and a relay still serving the old
index finds the old file gone and sends that request to the endpoint.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from facebench.errors import StorageError
from facebench.host.atomic import write_atomic
from facebench.host.paths import nearest_existing
from facebench.storage.address import Address
from facebench.storage.objects import get_with_headers, list_objects

log = logging.getLogger(__name__)

INDEX = "index.json"
_OBJECTS = "objects"
_FETCHERS = 8  # GETs in flight while the copy is taken
_PROGRESS_S = 10.0
# A response's headers that belong to the request, not the object: the relay makes its own.
VOLATILE = frozenset(
    {
        "date", "connection", "keep-alive", "transfer-encoding", "x-amz-request-id",
        "x-amz-id-2", "x-trans-id", "x-openstack-request-id",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One object in the copy: its ETag and size, the headers a GET of it answered with (name,
    value), and its file under objects/."""

    etag: str
    size: int
    headers: list[list[str]]
    file: str


@dataclass(frozen=True)
class Refreshed:
    """What a refresh found: objects in the copy, fetched now, forgotten, and bytes on disk."""

    objects: int
    fetched: int
    forgotten: int
    bytes: int
    seconds: float

    def describe(self, folder: Path) -> str:
        return (
            f"{self.objects:,} objects, {self.bytes / 1e6:,.1f} MB on disk in {folder} "
            f"({self.fetched:,} fetched now, {self.forgotten:,} gone from the bucket forgotten, "
            f"in {self.seconds:.1f} s)"
        )


class BucketCopy:
    """The copy as the relay reads it: its index, and each object's bytes from its file."""

    def __init__(self, folder: Path, entries: dict[str, Entry]) -> None:
        self.folder = folder
        self.entries = entries  # "bucket/key" -> Entry

    @classmethod
    def load(cls, folder: Path) -> BucketCopy:
        path = folder / INDEX
        if not path.is_file():
            return cls(folder, {})
        raw = json.loads(path.read_text())
        return cls(folder, {name: Entry(**entry) for name, entry in raw.items()})

    def find(self, bucket: str, key: str) -> Entry | None:
        return self.entries.get(f"{bucket}/{key}")

    def open(self, entry: Entry) -> int | None:
        """The object's file, open for reading (the caller closes it); None where the file is
        gone or cut short (another job's refresh replaced it): the request then goes to the
        endpoint."""
        try:
            fd = os.open(self.folder / _OBJECTS / entry.file, os.O_RDONLY)
        except OSError:
            return None
        if os.fstat(fd).st_size != entry.size:
            os.close(fd)
            return None
        return fd

    def read(self, entry: Entry) -> bytes | None:
        """The object's bytes, whole (None as for open)."""
        fd = self.open(entry)
        if fd is None:
            return None
        try:
            return os.pread(fd, entry.size, 0)
        finally:
            os.close(fd)


def file_name(bucket: str, key: str, etag: str) -> str:
    """An object's file: named by its address and ETag, so that a new version is a new file."""
    return hashlib.sha256(f"{bucket}/{key}\0{etag}".encode()).hexdigest()


def refresh(prefix: Address, folder: Path) -> Refreshed:
    """The copy of every object under prefix made current in folder (one at a time per folder:
    a lock), through the job's configured client; the objects outside prefix left as they are."""
    started = time.monotonic()
    (folder / _OBJECTS).mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        entries = BucketCopy.load(folder).entries
        listed = {
            f"{prefix.bucket}/{prefix.prefix}{item.key}": item for item in list_objects(prefix)
        }
        under = f"{prefix.bucket}/{prefix.prefix}"
        gone = [name for name in entries if name.startswith(under) and name not in listed]
        wanted = [
            name for name, item in listed.items()
            if name not in entries or entries[name].etag != item.etag
        ]  # fmt: skip
        _check_room(folder, sum(listed[name].size for name in wanted))
        for name in gone:
            _forget(folder, entries.pop(name))
        for name, entry in _fetch_all(prefix.bucket, wanted, folder):
            if name in entries:
                _forget(folder, entries[name])
            entries[name] = entry
        write_atomic(
            folder / INDEX,
            json.dumps(
                {name: dataclasses.asdict(entry) for name, entry in entries.items()}
            ).encode(),
        )
    return Refreshed(
        len(entries), len(wanted), len(gone), sum(entry.size for entry in entries.values()),
        time.monotonic() - started,
    )  # fmt: skip


def _fetch_all(bucket: str, names: list[str], folder: Path) -> Iterator[tuple[str, Entry]]:
    """Each object fetched whole into its file, _FETCHERS at a time, with a progress line."""
    if not names:
        return
    log.info("taking the emulated bucket's copy of %d objects", len(names))
    shown = time.monotonic()
    with ThreadPoolExecutor(_FETCHERS) as pool:
        for done, (name, entry) in enumerate(
            pool.map(lambda name: (name, _fetch(bucket, name, folder)), names), start=1
        ):
            if time.monotonic() - shown > _PROGRESS_S:
                log.info("the copy: %d of %d objects fetched", done, len(names))
                shown = time.monotonic()
            yield name, entry


def _fetch(bucket: str, name: str, folder: Path) -> Entry:
    """One object whole, through boto3 (the listing's client), with its GET's headers."""
    key = name[len(bucket) + 1 :]
    data, headers = get_with_headers(Address(bucket, key))
    etag = headers.get("etag", "").strip('"')
    kept = [[header, value] for header, value in headers.items() if header not in VOLATILE]
    entry = Entry(etag, len(data), kept, file_name(bucket, key, etag))
    path = folder / _OBJECTS / entry.file
    # No fsync for each object: a file cut short by a crash is found by its size (read()).
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_bytes(data)
    os.replace(staging, path)
    return entry


def _forget(folder: Path, entry: Entry) -> None:
    (folder / _OBJECTS / entry.file).unlink(missing_ok=True)


def _check_room(folder: Path, needed: int) -> None:
    """Refuse, before fetching anything, a copy its disk cannot hold (with 5% to spare)."""
    free = shutil.disk_usage(nearest_existing(folder)).free
    if needed * 1.05 > free:
        raise StorageError(
            f"the emulated bucket's copy needs {needed / 1e9:,.2f} GB more in {folder}, which "
            f"has {free / 1e9:,.2f} GB free: free some room there, set data.cache_dir to a "
            "larger disk, or read the server itself (storage.answers=endpoint)"
        )


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One refresh of a copy at a time (two jobs, or two tests, may share a cache)."""
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
