"""Which files in a shard folder facebench wrote: a build deletes those, and nothing else.

A shard folder may hold the user's own files (notes, lists, other tools' output). facebench knows
its own by name, from two records it keeps there:

- `manifest.json`, a finished set: its shards and their indexes;
- `.plan.json`, a build under way: the files it may write (`files`) and the files of the set it
  replaces (`replaces`). It is written before the old manifest is removed and before any file is
  deleted or written, so a build killed at any point leaves every file of its own named in it.

Anything else is the user's: left alone, and if a new set would have to overwrite it, named in one
line instead. Half-written files (`.<name>.tmp-<pid>`) and records of finished shards
(`.done/<name>.json`) are removed only for names facebench owns.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from facebench.errors import ShardError
from facebench.host.atomic import STAGING_MARK, write_atomic
from facebench.shards.manifest import MANIFEST

PLAN = ".plan.json"
DONE = ".done"  # one record per finished shard of a build under way


@dataclass
class Plan:
    """A build under way: what it makes (compared to resume) and the files it owns."""

    fingerprint: str
    settings: dict[str, Any]
    shards: list[str]  # the shards it writes, in order
    files: list[str] = field(default_factory=list)  # every file it may write (shards, indexes)
    replaces: list[str] = field(default_factory=list)  # files of the set it replaces

    def same_build(self, other: Plan | None) -> bool:
        """Whether other makes the very same shards (so its finished ones can be reused)."""
        return other is not None and (other.fingerprint, other.settings, other.shards) == (
            self.fingerprint,
            self.settings,
            self.shards,
        )

    def write(self, folder: Path) -> None:
        write_atomic(folder / PLAN, json.dumps(asdict(self)).encode())

    @classmethod
    def read(cls, folder: Path) -> Plan | None:
        """The plan of an unfinished build, or None (no build under way, or an unreadable one,
        whose files are then nobody's: a plan is only ever written whole)."""
        try:
            raw = json.loads((folder / PLAN).read_text(encoding="utf-8"))
            return cls(**raw)
        except (OSError, ValueError, TypeError):
            return None


def manifest_files(folder: Path) -> set[str]:
    """The files a finished set's manifest names (whatever facebench version wrote it)."""
    path = folder / MANIFEST
    if not path.is_file():
        return set()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        shards = raw["shards"]
        names = {entry["name"] for entry in shards}
        names |= {entry["name"] + ".index.npy" for entry in shards if entry.get("index_sha256")}
    except (OSError, ValueError, TypeError, KeyError):
        raise ShardError(
            f"{path}: not a facebench manifest, and facebench writes its own there. Move that "
            "file away, or set shards_dir=/another/folder"
        ) from None
    return {name for name in names if _inside(name)}


def owned(folder: Path, plan: Plan | None = None) -> set[str]:
    """Every file in folder that facebench wrote: a finished set's, and an unfinished build's."""
    plan = plan if plan is not None else Plan.read(folder)
    names = manifest_files(folder)
    if plan is not None:
        names |= {name for name in (*plan.files, *plan.replaces) if _inside(name)}
    return names


def _inside(name: str) -> bool:
    """A file in the folder, or in a folder of it that a format's library writes (Lance's
    `data/<file>`), named by plain names joined by "/": a damaged record must not point
    anywhere else."""
    return bool(name) and all(part not in ("", ".", "..") for part in name.split("/"))


def in_the_way(folder: Path, names: list[str], ours: set[str]) -> list[str]:
    """Names a build would write that already exist in folder and are not facebench's (or
    whose folder is a file of the user's)."""
    clashes = []
    for name in names:
        parents = list(Path(name).parents)[:-1]  # data/, for data/x.lance
        blocked = [
            str(p) for p in parents if os.path.lexists(folder / p) and not (folder / p).is_dir()
        ]
        if blocked:
            clashes.append(blocked[0])
        elif name not in ours and os.path.lexists(folder / name):
            clashes.append(name)
    return clashes


def refuse_in_the_way(folder: Path, clashes: list[str]) -> None:
    if clashes:
        more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
        raise ShardError(
            f"{folder / clashes[0]}{more}: not written by facebench, and the shard set would "
            "overwrite it. Move it out of the folder, or set shards_dir=/another/folder"
        )


def bytes_of(folder: Path, names: set[str]) -> int:
    """Bytes those files take now (the room a rebuild gets back)."""
    total = 0
    for name in names:
        try:
            total += os.lstat(folder / name).st_size
        except OSError:
            continue
    return total


def remove(folder: Path, names: set[str]) -> None:
    """Delete these files of facebench's, their half-written copies and their build records."""
    for name in names:
        path = folder / name
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
    # Folders a library wrote files into (Lance's data/), once nothing is left in them: a file
    # of the user's there keeps its folder.
    emptied = {parent for name in names if "/" in name for parent in Path(name).parents}
    for parent in sorted(emptied - {Path(".")}, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            (folder / parent).rmdir()
    remove_staging(folder, names)
    done = folder / DONE
    for name in names:
        (done / f"{name}.json").unlink(missing_ok=True)


def remove_staging(folder: Path, names: set[str]) -> None:
    """Half-written copies of these files (and of the records) that killed writers left."""
    for name in (*(n for n in names if "/" not in n), MANIFEST, PLAN):
        for stale in folder.glob(f".{_glob_escape(name)}{STAGING_MARK}*"):
            if stale.is_file():
                stale.unlink(missing_ok=True)
    done = folder / DONE
    if done.is_dir():
        for name in (n for n in names if "/" not in n):
            for stale in done.glob(f".{_glob_escape(name)}.json{STAGING_MARK}*"):
                stale.unlink(missing_ok=True)


def finish(folder: Path, plan: Plan) -> None:
    """A build is complete (its manifest written): its plan and its records go."""
    (folder / PLAN).unlink(missing_ok=True)
    done = folder / DONE
    for name in plan.shards:
        (done / f"{name}.json").unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not there, or something else was put there: leave it
        done.rmdir()


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
