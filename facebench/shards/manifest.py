"""manifest.json: what a shard set holds, what it was made from, and how to check it.

A shard set lives in a local folder or under an s3:// prefix (prepare.py storage=s3 uploads it
there); `Folder` is either, and the reads below take both: an object is one GET, counted as
the batch's request like an image's.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from facebench.data.images import read_file
from facebench.errors import ObjectMissing, ShardError
from facebench.host.atomic import write_atomic
from facebench.storage import objects
from facebench.storage.address import in_bucket, parse

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
INDEX_SUFFIX = ".index.npy"
# Each shard's index: (sample id, label) of its samples, in order. Small, and hashed in the
# manifest, so labels can be checked cheaply whatever the shard's format.
INDEX_RECORD = np.dtype([("id", np.int64), ("label", np.int64)])

Folder = Path | str  # a local folder, or an s3:// prefix ("s3://bucket/data/facebench-shards/...")


def entry_path(folder: Folder, name: str) -> Path | str:
    """Where a set's file is: a path in a local folder, an object's address under a prefix."""
    if isinstance(folder, str) and in_bucket(folder):
        return f"{folder.rstrip('/')}/{name}"
    return Path(folder) / name


def entry_name(path: Path | str) -> str:
    """A shard's name, from its path or its object's address."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]


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

    def encoded(self) -> bytes:
        return (json.dumps(asdict(self), indent=2) + "\n").encode()

    def write(self, folder: Path) -> None:
        """Write atomically: a reader sees the old manifest, no manifest, or this one whole."""
        write_atomic(folder / MANIFEST, self.encoded())

    @classmethod
    def read(cls, folder: Folder) -> Manifest | None:
        """The folder's (or prefix's) manifest, or None when there is none."""
        path = entry_path(folder, MANIFEST)
        if isinstance(path, str):
            if objects.head(path) is None:
                return None
            text = objects.read(path).decode("utf-8", errors="replace")
        elif not path.is_file():
            return None
        else:
            text = path.read_text(encoding="utf-8")
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str, path: Path | str) -> Manifest:
        """A manifest from its JSON text; `path` names it in errors."""
        try:
            raw = json.loads(text)
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

    def missing_or_resized(self, folder: Folder) -> list[str]:
        """Shards that are absent or whose size differs from the manifest (a cheap check: for a
        prefix, one listing)."""
        if isinstance(folder, str) and in_bucket(folder):
            return self._missing_objects(folder)
        wrong = []
        for shard in self.shards:
            path = folder / shard.name
            if not path.is_file() or path.stat().st_size != shard.bytes:
                wrong.append(shard.name)
            elif shard.index_sha256 and not (folder / shard.index_name).is_file():
                wrong.append(shard.index_name)
        return wrong

    def _missing_objects(self, prefix: str) -> list[str]:
        sizes = {entry.key: entry.size for entry in objects.list_objects(parse(prefix))}
        wrong = []
        for shard in self.shards:
            if sizes.get(shard.name) != shard.bytes:
                wrong.append(shard.name)
            elif shard.index_sha256 and shard.index_name not in sizes:
                wrong.append(shard.index_name)
        return wrong

    def corrupted(self, folder: Folder) -> list[str]:
        """Shards whose bytes do not hash to the manifest's sha256 (a full read of every shard)."""
        wrong = []
        for shard in self.shards:
            try:
                read_verified(entry_path(folder, shard.name), shard.sha256)
                if shard.index_sha256:  # formats whose items carry their labels have none
                    read_index(folder, shard)
            except (ShardError, OSError, ObjectMissing):
                wrong.append(shard.name)
        return wrong


def file_sha256(path: Path) -> str:
    """A local file's sha256, read in blocks (a whole-set format's files may be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_verified(path: Path | str, sha256: str) -> bytes:
    """A shard's bytes (a file's, or an object's), only if they hash to what the manifest
    recorded.

    The bytes that are hashed are the bytes that are returned, so nothing can swap the file
    between the check and its use.
    """
    if isinstance(path, str) and in_bucket(path):
        try:
            data = read_file(path)  # one GET, counted in the run's storage_* metrics
        except ObjectMissing:
            raise missing_shard(path) from None
    else:
        data = Path(path).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ShardError(
            f"{path}: sha256 {actual[:12]}... does not match the manifest ({sha256[:12]}...); "
            "refusing to load it. Rebuild the shards with prepare.py"
        )
    return data


def missing_shard(url: str) -> ShardError:
    """A shard the manifest names that is not in the bucket (deleted since the run checked)."""
    return ShardError(
        f"{url}: no such object, though the set's manifest names it. Upload the shards again: "
        "python prepare.py storage=s3 format=... with the same settings"
    )


def encode_index(ids: list[int], labels: list[int]) -> bytes:
    index = np.empty(len(ids), dtype=INDEX_RECORD)
    index["id"] = ids
    index["label"] = labels
    buffer = io.BytesIO()
    np.save(buffer, index, allow_pickle=False)
    return buffer.getvalue()


def read_index(folder: Folder, shard: ShardEntry) -> np.ndarray:
    """A shard's (id, label) index, only if it hashes to what the manifest recorded."""
    path = entry_path(folder, shard.index_name)
    data = read_verified(path, shard.index_sha256)
    index = np.load(io.BytesIO(data), allow_pickle=False)
    if index.dtype != INDEX_RECORD or len(index) != shard.samples:
        raise ShardError(f"{path}: not the index of {shard.name}; rebuild")
    return index
