"""manifest.json: what a shard set holds, what it was made from, and how to check it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from facebench.data.sources import Record
from facebench.errors import ShardError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ShardEntry:
    name: str
    samples: int
    bytes: int
    sha256: str


@dataclass
class Manifest:
    format: str
    source_fingerprint: str  # the source files (paths, labels, sizes)
    settings: dict[str, Any]  # everything else that decides the shards' content
    n_samples: int
    n_classes: int
    shards: list[ShardEntry] = field(default_factory=list)
    version: int = MANIFEST_VERSION
    prepare_s: float = 0.0

    def write(self, folder: Path) -> None:
        """Write atomically: a reader sees the old manifest, no manifest, or this one whole."""
        text = json.dumps(asdict(self), indent=2) + "\n"
        staging = folder / f".{MANIFEST}.tmp-{os.getpid()}"
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, folder / MANIFEST)

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The folder's manifest, or None when there is none."""
        path = folder / MANIFEST
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            raw["shards"] = [ShardEntry(**entry) for entry in raw["shards"]]
            return cls(**raw)
        except (ValueError, TypeError, KeyError) as error:
            raise ShardError(
                f"{path}: not a facebench manifest ({error}); delete the folder and run prepare.py"
            ) from None

    def matches(self, source_fingerprint: str, settings: dict[str, Any]) -> bool:
        return (
            self.version == MANIFEST_VERSION
            and self.source_fingerprint == source_fingerprint
            and self.settings == settings
        )

    def missing_or_resized(self, folder: Path) -> list[str]:
        """Shards that are absent or whose size differs from the manifest (a cheap check)."""
        wrong = []
        for shard in self.shards:
            path = folder / shard.name
            if not path.is_file() or path.stat().st_size != shard.bytes:
                wrong.append(shard.name)
        return wrong


def source_fingerprint(records: list[Record], root: Path) -> str:
    """sha256 over every source file's path (relative to root), label and size, in order."""
    digest = hashlib.sha256()
    for record in records:
        relative = os.path.relpath(record.path, root)
        digest.update(f"{relative}\t{record.label}\t{os.path.getsize(record.path)}\n".encode())
    return digest.hexdigest()


def read_verified(path: Path, sha256: str) -> bytes:
    """A shard's bytes, only if they hash to what the manifest recorded.

    The bytes that are hashed are the bytes that are returned, so nothing can swap the file
    between the check and its use.
    """
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ShardError(
            f"{path}: sha256 {actual[:12]}... does not match the manifest ({sha256[:12]}...); "
            "refusing to load it. Rebuild the shards with prepare.py"
        )
    return data
