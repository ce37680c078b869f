"""A local data set, uploaded under an s3:// prefix in the same layout: resumable, and never
overwriting what facebench did not write.

    upload_tree(Path(".cache/synthetic/n6000-seed0-v1"), parse("s3://facebench/data"))

One listing of the prefix says what is there already. A file whose object has its size and MD5
(the ETag of a single-part upload) is not sent again, so an upload cut short, by SIGKILL even,
resumes where it stopped. An object with other content is replaced only if facebench wrote it
(its metadata says so); any other stops the upload before anything is written, naming it.

The prefix's manifest (facebench-upload.json: every key, size and MD5) is written last, after
every object is in place, and removed first when anything is about to change: a manifest never
vouches for objects that are not there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from facebench.errors import StorageError
from facebench.host.progress import progress
from facebench.storage import objects
from facebench.storage.address import Address

log = logging.getLogger(__name__)

MANIFEST = "facebench-upload.json"
OWNER = "facebench"  # user metadata on every object facebench writes: {"facebench": "1"}
_SKIPPED = ("facebench-shards",)  # shards built beside a local data set: not part of it
_THREADS = 16  # uploads in flight: small objects, each a round trip


@dataclass(frozen=True)
class Uploaded:
    files: int  # in the data set
    sent: int  # uploaded now (the rest were there already)
    bytes_sent: int
    seconds: float


def _local_files(root: Path) -> list[str]:
    """Every file under root, relative, in a fixed order (the folders facebench builds aside)."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name not in _SKIPPED)
        relative = os.path.relpath(folder, root)
        for name in sorted(files):
            found.append(name if relative == "." else f"{relative}/{name}")
    if not found:
        raise StorageError(f"{root}: no files to upload")
    return sorted(found)


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_ours(url: str) -> bool:
    found = objects.head(url)
    return found is not None and found["metadata"].get(OWNER) == "1"


def upload_tree(root: Path, address: Address, threads: int = _THREADS) -> Uploaded:
    """Upload every file under root to address's prefix; what is there already stays."""
    started = time.monotonic()
    files = _local_files(root)
    if MANIFEST in files:
        raise StorageError(f"{root / MANIFEST}: a file named as facebench's manifest; rename it")
    there = {entry.key: (entry.size, entry.etag) for entry in objects.list_objects(address, log)}
    sums = {name: _md5(root / name) for name in files}
    to_send = []
    for name in files:
        listed = there.get(name)
        if listed is None:
            to_send.append(name)
        elif listed != ((root / name).stat().st_size, sums[name]):
            url = str(address.child(name))
            if not _is_ours(url):
                raise StorageError(
                    f"{url}: an object facebench did not write is there, with other content "
                    f"than {root / name}. Nothing was uploaded: move it, or upload to another "
                    "storage.url"
                )
            to_send.append(name)
    manifest_url = str(address.child(MANIFEST))
    if not to_send and MANIFEST in there:
        return Uploaded(len(files), 0, 0, time.monotonic() - started)
    if MANIFEST in there:
        if not _is_ours(manifest_url):
            raise StorageError(f"{manifest_url}: facebench did not write it; move it away")
        objects.delete(manifest_url)  # before anything changes, so that it vouches for nothing
    metadata = {OWNER: "1"}

    def send(name: str) -> int:
        objects.put_file(str(address.child(name)), str(root / name), metadata)
        return (root / name).stat().st_size

    sent_bytes = 0
    with ThreadPoolExecutor(threads, thread_name_prefix="facebench-upload") as pool:
        for size in progress(pool.map(send, to_send), len(to_send), "uploading", "files", log):
            sent_bytes += size
    entries = {name: [(root / name).stat().st_size, sums[name]] for name in files}
    body = json.dumps({"files": entries, "source": str(root)}, indent=0).encode()
    objects.put_bytes(manifest_url, body, metadata)
    return Uploaded(len(files), len(to_send), sent_bytes, time.monotonic() - started)
