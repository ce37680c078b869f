"""A local data set, uploaded under an s3:// prefix in the same layout: resumable, and never
overwriting what facebench did not write.

    upload_tree(Path(".cache/synthetic/n6000-seed0-v1"), parse("s3://facebench/data"))

One listing of the prefix says what is there already. A file whose object has its size and ETag
(its MD5, or its parts' for a multipart upload: objects.file_etag) is not sent again, so an
upload cut short, by SIGKILL even, resumes where it stopped. An object with other content is
replaced only if facebench wrote it (its metadata says so); any other stops the upload before
anything is written, naming it.

The prefix's manifest (facebench-upload.json: every key, size and ETag) is written last, after
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
    puts: int = 0  # requests billed as PUTs: each object's, multipart parts counted
    lists: int = 0  # ListObjectsV2 pages (1,000 keys each) read to find what was there


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


def _is_ours(url: str) -> bool:
    found = objects.head(url)
    return found is not None and found["metadata"].get(OWNER) == "1"


def upload_tree(
    root: Path,
    address: Address,
    threads: int = _THREADS,
    files: list[str] | None = None,
    last: dict[str, bytes] | None = None,
) -> Uploaded:
    """Upload every file under root (or those of `files`, relative to it) to address's prefix;
    what is there already stays. `last`: objects (a shard set's manifest) written after all
    the others and removed before any of them changes, as facebench's own manifest is."""
    started = time.monotonic()
    files = sorted(files) if files is not None else _local_files(root)
    last = dict(last or {})
    if MANIFEST in files or MANIFEST in last:
        raise StorageError(f"{root / MANIFEST}: a file named as facebench's manifest; rename it")
    there = {entry.key: (entry.size, entry.etag) for entry in objects.list_objects(address, log)}
    sums = {name: objects.file_etag(str(root / name)) for name in files}
    wanted = {name: ((root / name).stat().st_size, sums[name]) for name in files}
    finals = {name: (len(data), hashlib.md5(data, usedforsecurity=False).hexdigest())
              for name, data in last.items()}  # fmt: skip
    changing = [name for name, want in {**wanted, **finals}.items() if there.get(name) != want]
    for name in changing:
        if name in there and not _is_ours(str(address.child(name))):
            raise StorageError(
                f"{address.child(name)}: an object facebench did not write is there, with other "
                f"content than {root / name}. Nothing was uploaded: move it, or upload to "
                "another storage.url"
            )
    to_send = [name for name in changing if name in wanted]
    lists = max(1, -(-len(there) // 1000))
    if not changing and MANIFEST in there:
        return Uploaded(len(files), 0, 0, time.monotonic() - started, 0, lists)
    # Before anything changes, the manifests go, so that they vouch for nothing missing.
    for name in (MANIFEST, *last):
        url = str(address.child(name))
        if name in there:
            if not _is_ours(url):
                raise StorageError(f"{url}: facebench did not write it; move it away")
            objects.delete(url)
    metadata = {OWNER: "1"}

    def send(name: str) -> int:
        objects.put_file(str(address.child(name)), str(root / name), metadata)
        return (root / name).stat().st_size

    sent_bytes = 0
    with ThreadPoolExecutor(threads, thread_name_prefix="facebench-upload") as pool:
        for size in progress(pool.map(send, to_send), len(to_send), "uploading", "files", log):
            sent_bytes += size
    for name, data in last.items():
        objects.put_bytes(str(address.child(name)), data, metadata)
    entries = {name: list(wanted[name]) for name in files}
    entries.update({name: list(final) for name, final in finals.items()})
    body = json.dumps({"files": entries, "source": str(root)}, indent=0).encode()
    objects.put_bytes(str(address.child(MANIFEST)), body, metadata)
    puts = sum(objects.put_requests((root / name).stat().st_size) for name in to_send)
    puts += len(last) + 1  # the manifests, small: one PUT each
    seconds = time.monotonic() - started
    return Uploaded(len(files), len(to_send), sent_bytes, seconds, puts, lists)
