"""manifest.json: what a shard set holds, what it was made from, and how to check it."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from facebench.errors import ShardError
from facebench.host.atomic import write_atomic

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
INDEX_SUFFIX = ".index.npy"
# Each shard's index: (sample id, label) of its samples, in order. Small, and hashed in the
# manifest, so labels can be checked cheaply whatever the shard's format.
INDEX_RECORD = np.dtype([("id", np.int64), ("label", np.int64)])


class OutdatedManifest(ShardError):
    """A manifest from another facebench version: rebuild rather than trust it."""


@dataclass(frozen=True)
class ShardEntry:
    name: str
    samples: int
    bytes: int
    sha256: str
    index_sha256: str

    @property
    def index_name(self) -> str:
        return self.name + INDEX_SUFFIX

    def to_json(self) -> str:
        return json.dumps(asdict(self))


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
    # Folder data: each class's name, by index (the class-to-index map); empty for the faces.
    classes: list[str] = field(default_factory=list)

    def write(self, folder: Path) -> None:
        """Write atomically: a reader sees the old manifest, no manifest, or this one whole."""
        write_atomic(folder / MANIFEST, (json.dumps(asdict(self), indent=2) + "\n").encode())

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The folder's manifest, or None when there is none."""
        path = folder / MANIFEST
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("version") != MANIFEST_VERSION:
                raise OutdatedManifest(
                    f"{path}: written by another facebench version (manifest version "
                    f"{raw.get('version')}, this one reads {MANIFEST_VERSION}). Rebuild: python "
                    f"prepare.py format={raw.get('format', 'pickle')}"
                )
            raw["shards"] = [ShardEntry(**entry) for entry in raw["shards"]]
            return cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ShardError(
                f"{path}: not a facebench manifest ({error}), and facebench writes its own there. "
                "Move that file away (a damaged manifest only makes the set be rebuilt), or set "
                "shards_dir=/another/folder"
            ) from None

    def digest(self) -> str:
        """Identifies this very shard set: any rebuild changes it (shard hashes, prepare_s)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

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
            elif shard.index_sha256 and not (folder / shard.index_name).is_file():
                wrong.append(shard.index_name)
        return wrong

    def corrupted(self, folder: Path) -> list[str]:
        """Shards whose bytes do not hash to the manifest's sha256 (a full read of every shard)."""
        wrong = []
        for shard in self.shards:
            try:
                read_verified(folder / shard.name, shard.sha256)
                if shard.index_sha256:  # formats whose items carry their labels have none
                    read_index(folder, shard)
            except (ShardError, OSError):
                wrong.append(shard.name)
        return wrong


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


def encode_index(ids: list[int], labels: list[int]) -> bytes:
    index = np.empty(len(ids), dtype=INDEX_RECORD)
    index["id"] = ids
    index["label"] = labels
    buffer = io.BytesIO()
    np.save(buffer, index, allow_pickle=False)
    return buffer.getvalue()


def read_index(folder: Path, shard: ShardEntry) -> np.ndarray:
    """A shard's (id, label) index, only if it hashes to what the manifest recorded."""
    data = read_verified(folder / shard.index_name, shard.index_sha256)
    index = np.load(io.BytesIO(data), allow_pickle=False)
    if index.dtype != INDEX_RECORD or len(index) != shard.samples:
        raise ShardError(f"{folder / shard.index_name}: not the index of {shard.name}; rebuild")
    return index
