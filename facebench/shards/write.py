"""Writing a shard set into its folder, deleting only what facebench wrote (shards/owned.py).

Shard by shard (resumable): the plan is written first, then each shard and its index under
temporary names, renamed, and a record of the finished shard; a build that finds a plan equal
to its own reuses every shard whose record exists and whose bytes still hash as recorded.

Whole set (a format whose library writes the set in one go): into a staging folder of
facebench's own, then the older set's files make way and the new ones are moved in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from facebench.data.records import Record
from facebench.errors import ShardError
from facebench.host.atomic import write_atomic
from facebench.host.parallel import map_in_processes
from facebench.host.progress import progress
from facebench.host.resources import usable_cores
from facebench.shards import formats, owned, room
from facebench.shards.formats import Settings, ShardFormat
from facebench.shards.manifest import MANIFEST, ShardEntry, encode_index, read_verified
from facebench.shards.owned import DONE, Plan
from facebench.shards.plan import Cut

log = logging.getLogger(__name__)

# Where a whole-set format's library writes before its files are moved in: facebench's own.
STAGING = ".facebench-build"


def start_or_resume(folder: Path, plan: Plan, needed: int) -> dict[str, ShardEntry]:
    """Shards already finished under this very plan; otherwise the files of the set it replaces
    (facebench's own, and nothing else) removed, and its plan written first."""
    previous = Plan.read(folder)
    if plan.same_build(previous):
        plan.replaces = previous.replaces
        (folder / MANIFEST).unlink(missing_ok=True)  # a kill may have come just before
        owned.remove(folder, set(plan.replaces) - set(plan.files))
        owned.remove_staging(folder, set(plan.files))  # from writers that were killed
        room.check_room(folder, needed, owned.bytes_of(folder, set(plan.files)))
        done = _finished_shards(folder, plan)
        if done:
            log.info("%s: resuming an interrupted build; %d shards already done", folder, len(done))
        return done
    ours = owned.owned(folder, previous)
    owned.refuse_in_the_way(folder, owned.in_the_way(folder, plan.files, ours))
    room.check_room(folder, needed, owned.bytes_of(folder, ours))
    plan.replaces = sorted(ours)
    plan.write(folder)  # first: from here on every file of facebench's is named in it
    # The folder is not a shard set until the new manifest is written.
    (folder / MANIFEST).unlink(missing_ok=True)
    owned.remove(folder, ours)
    return {}


def write_missing(
    folder: Path,
    shard_format: ShardFormat,
    plan: Plan,
    cut: Cut,
    done: dict[str, ShardEntry],
    records: list[Record],
    n_procs: int,
    needed: int,
    settings: Settings,
) -> None:
    """Write the shards not done yet (in processes), adding each to `done` as it is finished."""
    tasks = [
        (shard_format.name, str(folder), name, [(int(i), records[i]) for i in chunk], settings)
        for name, chunk in zip(cut.names, cut.chunks, strict=True)
        if name not in done
    ]
    log.info(
        "writing %d samples into %d %s shards in %s (%d to write, %d processes)",
        len(records),
        len(cut.names),
        shard_format.name,
        folder,
        len(tasks),
        max(1, min(n_procs, usable_cores(), len(tasks))),
    )
    written = map_in_processes(_write_shard, tasks, n_procs)
    try:
        for entry in progress(written, len(tasks), "writing shards", "shards", log):
            done[entry.name] = entry
    except OSError as error:
        if error.errno not in room.DISK_FULL:
            raise
        # Other writers may have been stopped half way: nothing of theirs stays to fill the disk.
        owned.remove_staging(folder, set(plan.files))
        raise room.disk_full(folder, needed, len(done), len(cut.names)) from None


def write_whole_set(
    folder: Path,
    shard_format: ShardFormat,
    plan: Plan,
    samples: list[tuple[int, Record]],
    n_procs: int,
    cache: Path,
    needed: int,
    settings: Settings,
) -> list[ShardEntry]:
    """The format's own library writes every sample (in this order) into a staging folder; then
    the older set's files (facebench's, named in its manifest or plan) make way for the new
    ones, which are moved in. Nothing else in the folder is touched."""
    previous = Plan.read(folder)
    ours = owned.owned(folder, previous)
    # Names the library may choose, checked now rather than after a long build.
    owned.refuse_in_the_way(folder, _foreign_names(folder, shard_format, ours))
    room.check_room(folder, needed, owned.bytes_of(folder, ours))
    plan.replaces = sorted(ours)
    plan.write(folder)
    (folder / MANIFEST).unlink(missing_ok=True)  # not a shard set until the new manifest
    staging = folder / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a killed build's
    staging.mkdir()
    log.info("writing %d samples as format=%s into %s", len(samples), shard_format.name, folder)
    try:
        entries = shard_format.write_set(samples, staging, n_procs, cache, settings)
        # Every file, by its path in the set: a library may write folders (Lance's data/).
        names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        owned.refuse_in_the_way(folder, owned.in_the_way(folder, names, ours))
        plan.files = names
        plan.write(folder)  # before the move: a kill half way leaves them named as facebench's
        owned.remove(folder, ours - set(names))
        for name in names:  # into folders that may hold files of the user's, which stay
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, folder / name)
    except OSError as error:
        if error.errno in room.DISK_FULL:
            raise room.disk_full(folder, needed, 0, 1) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entries


def _foreign_names(folder: Path, shard_format: ShardFormat, ours: set[str]) -> list[str]:
    """Files of the user's whose names the format's library may write."""
    return [
        name
        for name in sorted(os.listdir(folder))
        if shard_format.writes(name) and name not in ours and not (folder / name).is_dir()
    ]


def _finished_shards(folder: Path, plan: Plan) -> dict[str, ShardEntry]:
    """The shards an interrupted build of this plan recorded as finished, whose bytes still
    match."""
    done = {}
    for name in plan.shards:
        record = folder / DONE / f"{name}.json"
        try:
            entry = ShardEntry(**json.loads(record.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue
        # Re-hashed: a crash can leave a file of the right size that never got its bytes.
        try:
            read_verified(folder / entry.name, entry.sha256)
            read_verified(folder / entry.index_name, entry.index_sha256)
        except (ShardError, OSError):
            continue
        done[entry.name] = entry
    return done


def _write_shard(task: tuple[str, str, str, list[tuple[int, Record]], Settings]) -> ShardEntry:
    format_name, folder, name, samples, settings = task
    data = formats.get(format_name).encode(samples, settings)
    index = encode_index([i for i, _ in samples], [r.label for _, r in samples])
    entry = ShardEntry(
        name=name,
        samples=len(samples),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        index_sha256=hashlib.sha256(index).hexdigest(),
    )
    write_atomic(Path(folder) / entry.index_name, index)
    write_atomic(Path(folder) / name, data)
    done = Path(folder) / DONE
    done.mkdir(exist_ok=True)
    write_atomic(done / f"{name}.json", entry.to_json().encode())
    return entry
