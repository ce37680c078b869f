"""Whether a shard folder already holds the set a build would make: its manifest describes the
same source files and settings, and every shard is in place at its recorded size."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from facebench.config.schema import ROW_GROUP_SIZE
from facebench.data.images import CELEBA_BOX
from facebench.data.transforms import ARTICLE
from facebench.shards import formats
from facebench.shards.manifest import Manifest, OutdatedManifest

log = logging.getLogger(__name__)


def settings_for(
    shard_format: str,
    seed: int,
    shard_size: int,
    skipped: list[str] | None = None,
    resize: int = ARTICLE.resize,
    row_group_size: int = ROW_GROUP_SIZE,
) -> dict[str, Any]:
    """Everything besides the source files that decides what the shards hold."""
    settings = {
        "format": shard_format,
        "seed": seed,
        "shard_size": shard_size,
        "celeba_box": list(CELEBA_BOX),
        "decoded_mode": "RGB",
        "skipped": left_out(skipped),
    }
    if formats.get(shard_format).resized:  # its records hold resized pixels
        settings["resize"] = resize
    if formats.get(shard_format).row_groups:
        settings["row_group_size"] = row_group_size
    return settings


def left_out(skipped: list[str] | frozenset[str] | None) -> str:
    """The samples on_bad_sample=skip left out, as the settings record them (their paths or
    addresses, hashed)."""
    return hashlib.sha256(os.fsencode("\n".join(sorted(skipped or [])))).hexdigest()


def up_to_date(folder: Path, fingerprint: str, settings: dict[str, Any]) -> Manifest | None:
    """The folder's manifest if it describes these sources and settings and is complete."""
    try:
        existing = Manifest.read(folder)
    except OutdatedManifest as error:
        log.info("%s; rebuilding", str(error).split(". Rebuild", 1)[0])
        return None
    if existing is None:
        return None
    if not existing.matches(fingerprint, settings):
        log.info("%s: built from other source files or settings; rebuilding", folder)
        return None
    wrong = existing.missing_or_resized(folder)
    if wrong:
        log.warning("%s: %s missing or resized; rebuilding it", folder, ", ".join(wrong[:3]))
        return None
    log.info(
        "shards up to date in %s (%d shards, %d samples); nothing to do",
        folder,
        len(existing.shards),
        existing.n_samples,
    )
    return existing
