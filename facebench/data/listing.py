"""The data as a run finds it, once, before any clock (Listing): every record, its labels, and
which samples can be used: files that exist, are not empty, and decode.

Every run checks that each listed file exists and is not empty (a stat per file) before any work.
With on_bad_sample=skip it also decodes every image once (in parallel, with progress) and leaves
out those that fail, in every loader alike; the verdict is cached per source fingerprint, so later
runs over the same files only read the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from facebench.config import OnBadSample, choice
from facebench.data.bucket_records import BucketListing, bucket_fingerprint, read_bucket_records
from facebench.data.images import BadImage, open_sample
from facebench.data.sources import FACES, LabelSpace, Layout, Record, read_records
from facebench.errors import DataError, FacebenchError
from facebench.host.atomic import write_atomic
from facebench.host.parallel import map_in_processes
from facebench.host.progress import progress
from facebench.storage.address import Address

log = logging.getLogger(__name__)

_CHUNK = 2000


@dataclass(frozen=True)
class Usable:
    records: list[Record]  # in canonical order, bad ones left out
    skipped: list[tuple[str, str]]  # (path, reason)

    @property
    def excluded(self) -> frozenset[str]:
        return frozenset(path for path, _ in self.skipped)


@dataclass(frozen=True)
class Listing:
    """The data as found, once, before any clock: every record, their labels, the usable ones."""

    root: Path | str  # a folder, or an s3:// prefix
    records: list[Record]
    labels: LabelSpace
    usable: Usable
    # Under a prefix: bucket_fingerprint of the records (keys, labels, sizes, ETags), which a
    # shard set uploaded there records as what it was made from. Empty for a folder.
    fingerprint: str = ""


def list_usable(
    root: Path, on_bad_sample: str, cache: Path, n_procs: int = 1, layout: Layout = FACES
) -> Listing:
    """List every sample under root and check that its files can be used."""
    records, labels = read_records(root, layout)
    usable = usable_records(records, root, on_bad_sample, cache, n_procs)
    return Listing(root, records, labels, usable)


def list_bucket_usable(
    address: Address, on_bad_sample: str, cache: Path, n_procs: int = 1, layout: Layout = FACES
) -> Listing:
    """The same for a data set under an s3:// prefix: one listing, the sizes from it."""
    records, labels, found = read_bucket_records(address, layout)
    root = str(address.child())
    usable = usable_records(records, root, on_bad_sample, cache, n_procs, found)
    return Listing(root, records, labels, usable, bucket_fingerprint(records, found))


def source_fingerprint(records: list[Record], root: Path) -> str:
    """sha256 over every source file's path (relative to root), label, size and modification
    time (-1 if missing): a file replaced by one of the same size still changes it."""
    digest = hashlib.sha256()
    for record in records:
        relative = os.path.relpath(record.path, root)
        try:
            stat = os.stat(record.path)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:
            size = mtime = -1
        # The name's bytes as the OS gives them: a name that is not UTF-8 hashes too.
        digest.update(os.fsencode(f"{relative}\t{record.label}\t{size}\t{mtime}\n"))
    return digest.hexdigest()


def _stat_problem(path: str, found: BucketListing | None = None) -> str | None:
    if found is not None:
        size = found.size(path)
        if size is None:
            return "object not found"
        return "empty object (0 bytes)" if size == 0 else None
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return "file not found"
    except OSError as error:
        return f"cannot read ({error.strerror})"
    return "empty file (0 bytes)" if size == 0 else None


def _decode_problems(records: list[Record], stat: bool = True) -> list[tuple[str, str]]:
    problems = []
    for record in records:
        reason = _stat_problem(record.path) if stat else None
        if reason is None:
            try:
                open_sample(record.path, record.source)
            except BadImage as error:
                reason = error.reason
            except FacebenchError as error:
                reason = str(error)
        if reason is not None:
            problems.append((record.path, reason))
    return problems


def usable_records(
    records: list[Record],
    root: Path | str,
    on_bad_sample: str,
    cache: Path,
    n_procs: int = 1,
    found: BucketListing | None = None,
) -> Usable:
    """The records to use; raises DataError on the first bad file when on_bad_sample=raise.
    `found`: the bucket listing the records come from (their sizes), for data in a bucket."""
    on_bad_sample = choice(OnBadSample, on_bad_sample, "on_bad_sample")
    if on_bad_sample == "raise":
        missing = [(r.path, reason) for r in records if (reason := _stat_problem(r.path, found))]
        if missing:
            path, reason = missing[0]
            raise DataError(
                f"{path}: {reason} ({len(missing)} such files in {root}). Restore them, or run "
                "with on_bad_sample=skip to leave them out"
            )
        return Usable(records, [])
    skipped = _cached_problems(records, root, cache, n_procs, found)
    bad = {path for path, _ in skipped}
    for path, reason in skipped:
        log.warning("skipping %s: %s", path, reason)
    if skipped:
        log.warning("on_bad_sample=skip: left out %d of %d samples", len(skipped), len(records))
    usable = [r for r in records if r.path not in bad]
    if not usable:
        raise DataError(f"{root}: no usable images (all {len(records)} failed to decode)")
    return Usable(usable, skipped)


def _stat_problems(records: list[Record], found: BucketListing) -> list[tuple[str, str]]:
    return [(r.path, reason) for r in records if (reason := _stat_problem(r.path, found))]


def _decode_listed(records: list[Record]) -> list[tuple[str, str]]:
    return _decode_problems(records, stat=False)


def _cached_problems(
    records: list[Record], root: Path | str, cache: Path, n_procs: int, found: BucketListing | None
) -> list[tuple[str, str]]:
    # Keyed by the files' relative paths, labels, sizes and times (an object's ETag); stored
    # relative to the root.
    if found is None:
        fingerprint = source_fingerprint(records, Path(root))
    else:
        fingerprint = bucket_fingerprint(records, found)
    path = cache / "checks" / f"{fingerprint[:24]}.json"
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        return [(os.path.join(root, relative), reason) for relative, reason in stored]
    problems: list[tuple[str, str]] = []
    check = _decode_problems
    if found is not None:  # sizes from the listing, here; the objects' decoding in processes
        problems = _stat_problems(records, found)
        bad = {bad_path for bad_path, _ in problems}
        records = [record for record in records if record.path not in bad]
        check = _decode_listed
    chunks = [records[i : i + _CHUNK] for i in range(0, len(records), _CHUNK)]
    log.info("checking that %d images decode (once; cached in %s)", len(records), path)
    results = map_in_processes(check, chunks, n_procs)
    for found in progress(results, len(chunks), "checking images", "chunks", log):
        problems += found
    path.parent.mkdir(parents=True, exist_ok=True)
    relative = [(os.path.relpath(bad, root), reason) for bad, reason in problems]
    write_atomic(path, json.dumps(relative).encode())
    return problems
