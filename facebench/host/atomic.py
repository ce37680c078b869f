"""Writing a file so that a crash, a kill or a full disk leaves all of it or nothing."""

from __future__ import annotations

import os
from pathlib import Path

STAGING_MARK = ".tmp-"


def staging_name(path: Path) -> Path:
    """Where path is written before it is renamed into place: hidden, and named by process."""
    return path.with_name(f".{path.name}{STAGING_MARK}{os.getpid()}")


def write_atomic(path: Path, data: bytes) -> None:
    """Write, flush to disk, then rename: after a crash the name holds all of it or nothing.

    A write that fails (a full disk, say) removes its staging file rather than leave it to keep
    the disk full.
    """
    staging = staging_name(path)
    try:
        with open(staging, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def remove_staging(folder: Path) -> int:
    """Delete staging files that writers which were killed left in folder; returns how many."""
    removed = 0
    for stale in folder.glob(f".*{STAGING_MARK}*"):
        if stale.is_file():
            stale.unlink(missing_ok=True)
            removed += 1
    return removed
