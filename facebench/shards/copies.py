"""Copies a reading library makes of a shard set (Hugging Face datasets' Arrow copy of a Parquet
set), kept in data.cache_dir between runs and trusted only while the set's files are the ones
that made them.

A copy lives in a folder of its own, named by the set's place and its manifest's files (names,
sizes, sha256): a rebuilt set, whose files hash otherwise, gets another folder, whatever the
library's own cache key says (datasets keys local files by their modification time alone, which
a copy that keeps times, `cp -p` or `rsync -a`, leaves as it was). Beside the copy, `made-from.json`
records each file as it was when the copy was made (its size, modification and change times and
inode, or a bucket's ETag): a file changed since, even one its manifest was made to agree with,
has the copy made again, and a file that cannot be read then ends the run in the library's own
line. One process at a time checks or makes a copy (a lock beside it).

Copies of a set that was rebuilt are removed: when facebench rebuilds it in a folder
(shards/build.py), and when a copy of the new set is made (a set uploaded to a bucket: then).
Only folders holding facebench's `made-from.json` are ever removed, as shard folders keep any
file facebench did not write; copies made before these records were kept are not facebench's
to tell apart (data.cache_dir/hf-datasets/parquet/: remove by hand).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from facebench.host.atomic import write_atomic
from facebench.shards.manifest import Folder, Manifest
from facebench.storage import objects
from facebench.storage.address import in_bucket, parse

log = logging.getLogger(__name__)

MADE_FROM = "made-from.json"
# The folder under data.cache_dir where datasets keeps its copies, one folder per copy.
ARROW_COPIES = "hf-datasets"


@dataclass(frozen=True)
class SetCopy:
    """Where a library's copy of one shard set is, and the files it must have been made from."""

    folder: Path  # the library's cache folder for this copy alone
    made_from: dict[str, Any]  # {"set": where the set is, "files": [[name, size, version]]}

    def current(self) -> bool:
        """Whether the copy there was made, in full, from the set's files as they are now."""
        return _record(self.folder) == self.made_from

    def renew(self) -> None:
        """Clear what is in the copy's folder unless it is current: the library makes it again."""
        record = _record(self.folder)
        if not self.folder.exists() or record == self.made_from:
            return
        changed = _changed_file(record, self.made_from) if record else ""
        if changed:
            log.info(
                "%s changed since the Arrow copy in %s was made; making it again",
                changed, self.folder,
            )  # fmt: skip
        shutil.rmtree(self.folder, ignore_errors=True)

    @contextmanager
    def making(self) -> Iterator[None]:
        """One process at a time checks, clears or makes this copy (sweep jobs, a job's ranks,
        prepare.py beside train.py): a copy another process is still making is never taken for
        an interrupted one. A POSIX lock, dropped however its process ends."""
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        with open(self.folder.parent / f"{self.folder.name}.lock", "a+b") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            yield

    def made(self) -> None:
        """Record that the copy is whole and what it was made from (after the library's own
        copy is complete: a copy interrupted before has no record, and is made again)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder / MADE_FROM, json.dumps(self.made_from).encode())
        forget(self.folder.parent, self.made_from["set"], keep=self.folder)


def copy_for(cache: Path, folder: Folder, manifest: Manifest) -> SetCopy:
    """The copy of this set under `cache` (data.cache_dir/hf-datasets), with its files as they
    are now: each one's size and modification time, or for a bucket its ETag (one listing)."""
    where = _place(folder)
    named = [[shard.name, shard.bytes, shard.sha256] for shard in manifest.shards]
    key = hashlib.sha256(json.dumps([where, named]).encode()).hexdigest()[:24]
    return SetCopy(cache / key, {"set": where, "files": _versions(folder, manifest)})


def _place(folder: Folder) -> str:
    """The set's place, one spelling for each: a folder's absolute path, a prefix unslashed."""
    if isinstance(folder, str) and in_bucket(folder):
        return folder.rstrip("/")
    return str(Path(folder).resolve())


def _versions(folder: Folder, manifest: Manifest) -> list[list[Any]]:
    if isinstance(folder, str) and in_bucket(folder):
        listed = {entry.key: entry for entry in objects.list_objects(parse(folder))}
        found = [listed.get(shard.name) for shard in manifest.shards]
        return [
            [shard.name, entry.size if entry else -1, entry.etag if entry else ""]
            for shard, entry in zip(manifest.shards, found, strict=True)
        ]
    versions = []
    for shard in manifest.shards:
        try:
            stat = (Path(folder) / shard.name).stat()
        except OSError:
            versions.append([shard.name, -1, 0, 0, 0])
            continue
        # The change time and inode too: a copy that keeps times (cp -p, rsync -a) keeps the
        # modification time, but not these.
        versions.append([shard.name, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino])
    return versions


def _record(copy: Path) -> dict[str, Any] | None:
    """What a copy's made-from.json says it was made from; None where it has none (a copy
    interrupted, or not facebench's) or one that cannot be read."""
    try:
        return json.loads((copy / MADE_FROM).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _changed_file(before: dict[str, Any], now: dict[str, Any]) -> str:
    """The first file whose size or version differs from the copy's record."""
    was = {name: rest for name, *rest in before.get("files", [])}
    for name, *rest in now["files"]:
        if was.get(name) != rest:
            return f"{now['set']}/{name}"
    return ""


def forget(cache: Path, where: Folder, keep: Path | None = None) -> int:
    """Remove the copies made from the set at `where` (all but `keep`): a set rebuilt there
    makes them stale. Returns how many were removed."""
    if not cache.is_dir():
        return 0
    removed = 0
    place = _place(where)
    for stamp in cache.glob(f"*/{MADE_FROM}"):
        copy = stamp.parent
        record = _record(copy) if copy != keep else None
        if record is not None and record.get("set") == place:
            shutil.rmtree(copy, ignore_errors=True)
            removed += 1
    if removed:
        log.info("removed %d Arrow copies of the set that was in %s", removed, where)
    return removed
