"""LitData's optimized format: chunk files of decoded 112x112 uint8 samples, written by
litdata.optimize, streamed by its StreamingDataset.

Each item is {"image": (112, 112, 3) uint8, "id": sample id, "label": label}: the article's
samples after their one deterministic step, as raw stores them. bench/litdata_items.py measured
both choices (2026-11-30, 20,000 synthetic images, warm, batch 600, n_workers 2, 2 cores, nothing
else running): decoded items streamed at 2,986 images/s, the files' encoded bytes (decoded in the
workers) at 2,267, for 2.1x the disk (0.70 GiB against 0.33). Decoded wins on speed, and it makes
the loader measure what LitData's streaming costs; encoded, it would measure decoding again, as
webdataset already does.

litdata.optimize writes the whole set at once (its own workers, in the shuffled order), so a killed
build is rebuilt from the start rather than resumed. Three of its habits are kept out of a run: it
switches the whole process to the `spawn` start method unless told otherwise (which made a reader
in the same process 5-10x slower): here it is told `fork`, and the start method is put back; it
stages chunks in $TMPDIR/chunks: here in facebench's cache; and it prints an account message: its
output goes to the log at debug level.

LitData's index names, for each field of an item, the serializer that reads it back, and its
`pickle` serializer (like `graph`'s fallback) unpickles whatever a chunk holds. facebench writes
numpy images and int ids and labels only, so a set whose index asks for anything else is refused
before LitData reads it (check_set), and the loader gives LitData no serializer but those two
(serializers()): an index changed after the check still cannot make it unpickle.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
from torchvision.transforms import functional

from facebench.data.images import BadImage, bad_image, open_sample
from facebench.data.sources import Record
from facebench.errors import ShardError
from facebench.host.extras import Requirement
from facebench.shards.formats import Settings, ShardFormat, resize_of
from facebench.shards.manifest import (
    Folder,
    Manifest,
    ShardEntry,
    entry_path,
    file_sha256,
    read_verified,
)

log = logging.getLogger(__name__)

SUFFIX = ".bin"
INDEX = "index.json"  # litdata's own index of its chunks
CHUNK_BYTES = "64MB"
_ITEM_HEADER_BYTES = 64  # litdata's per-item header, id and label
# What Items' {"image", "id", "label"} make litdata.optimize write into its index's config: the
# serializer of each field (in the item's key order) and how chunks are laid out.
WRITTEN = {
    "data_format": ["numpy", "int", "int"],
    "item_loader": "PyTreeLoader",
    "compression": None,
    "encryption": None,
}
SERIALIZERS = ("numpy", "int")
_REBUILD = "python prepare.py format=litdata (into a folder only you can write to)"


def writes(name: str) -> bool:
    """Whether litdata.optimize may write a file of this name: its index and chunk files."""
    return name == INDEX or (name.startswith("chunk-") and name.endswith(SUFFIX))


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """The set's bytes: fixed-size items, whatever the chunking."""
    return [float(sum(sizes) * (resize * resize * 3 + _ITEM_HEADER_BYTES))]


class Items:
    """One sample, decoded and resized as raw stores it (runs in litdata's workers).

    A sample that fails does not raise there: litdata would wrap the error in its own and leave
    forked helper processes behind, waiting forever. Its error is written to `errors` instead, a
    stand-in item (id -1) takes its place, and write_set raises it once optimize has finished.
    """

    def __init__(self, errors: Path, resize: int) -> None:
        self.errors = errors
        self.size = [resize, resize]

    def __call__(self, sample: tuple[int, Record]) -> dict:
        sample_id, record = sample
        try:
            image = functional.resize(open_sample(record.path, record.source), self.size)
        except Exception as error:
            bad = error if isinstance(error, BadImage) else bad_image(record.path, error)
            (self.errors / f"{sample_id}.txt").write_text(str(bad), encoding="utf-8")
            image = np.zeros((*self.size, 3), dtype=np.uint8)
            sample_id = -1
        return {"image": np.asarray(image), "id": sample_id, "label": record.label}


def write_set(
    samples: list[tuple[int, Record]], folder: Path, n_procs: int, cache: Path, settings: Settings
) -> list:
    """Write every sample (in this order) with litdata.optimize into folder, a staging folder of
    facebench's own (optimize may empty it); its chunks, as manifest entries (index_sha256
    empty: the labels travel in the items)."""
    import litdata

    staging = cache / "litdata-staging" / str(os.getpid())
    shutil.rmtree(staging, ignore_errors=True)
    errors = cache / "litdata-errors" / str(os.getpid())  # not in staging: litdata empties it
    shutil.rmtree(errors, ignore_errors=True)
    errors.mkdir(parents=True)
    previous_method = multiprocessing.get_start_method(allow_none=True)
    previous_cache = os.environ.get("DATA_OPTIMIZER_CACHE_FOLDER")
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(staging)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            litdata.optimize(
                fn=Items(errors, resize_of(settings)),
                inputs=samples,
                output_dir=str(folder),
                chunk_bytes=CHUNK_BYTES,
                num_workers=max(1, min(n_procs, len(samples))),
                start_method="fork",
                keep_data_ordered=True,
                reorder_files=False,
                mode="overwrite",
                verbose=False,
            )
        failed = sorted(errors.iterdir())
        if failed:
            shutil.rmtree(folder, ignore_errors=True)  # chunks with stand-ins are not a set
            raise BadImage(failed[0].read_text(encoding="utf-8"))
    finally:
        multiprocessing.set_start_method(previous_method, force=True)
        if previous_cache is None:
            os.environ.pop("DATA_OPTIMIZER_CACHE_FOLDER", None)
        else:
            os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = previous_cache
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(errors, ignore_errors=True)
        log.debug("litdata.optimize said: %s", printed.getvalue().strip())
    return entries(folder)


def entries(folder: Path) -> list[ShardEntry]:
    """litdata's index and chunks, each with its size and sha256."""
    index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    found = [ShardEntry(INDEX, 0, (folder / INDEX).stat().st_size, file_sha256(folder / INDEX), "")]
    for chunk in index["chunks"]:
        path = folder / chunk["filename"]
        found.append(
            ShardEntry(
                chunk["filename"], chunk["chunk_size"], path.stat().st_size, file_sha256(path), ""
            )
        )
    return found


def check_set(folder: Folder, manifest: Manifest) -> None:
    """Refuse a set whose index (the bytes its manifest records) asks LitData for anything
    facebench does not write: another serializer (its `pickle` runs code from the chunks), a
    compression, an encryption or an item loader of its own."""
    entry = next((shard for shard in manifest.shards if shard.name == INDEX), None)
    if entry is None:
        raise ShardError(f"{folder}: its manifest names no {INDEX}. Rebuild: {_REBUILD}")
    index = entry_path(folder, INDEX)
    try:
        config = json.loads(read_verified(index, entry.sha256))["config"]
        found = {key: config.get(key) for key in WRITTEN}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ShardError(
            f"{index}: not an index LitData wrote for facebench ({error}). Rebuild: {_REBUILD}"
        ) from None
    if found == WRITTEN:
        return
    named = found["data_format"] if isinstance(found["data_format"], list) else []
    foreign = sorted({str(name) for name in named} - set(SERIALIZERS))
    what = (
        f"LitData serializer(s) {', '.join(foreign)} for its items (facebench writes only "
        f"{' and '.join(SERIALIZERS)}; LitData's pickle serializer runs code from the chunks)"
        if foreign
        else ", ".join(f"{key} {found[key]!r}" for key in WRITTEN if found[key] != WRITTEN[key])
    )
    raise ShardError(
        f"{index}: names {what}, which facebench never writes; refused before LitData "
        f"read it. Use only LitData sets you built: {_REBUILD}"
    )


class Refused:
    """A LitData serializer that deserializes nothing: stands in, in the loader, for every
    serializer but those facebench writes. LitData calls setup() with the field's name from the
    index before it reads any chunk."""

    def __init__(self, name: str) -> None:
        self.name = name

    def setup(self, metadata: object) -> None:
        raise ShardError(
            f"LitData was asked for its {self.name!r} serializer ({metadata!r}), which "
            f"facebench never writes; refused. Rebuild: {_REBUILD}"
        )

    def serialize(self, item: object) -> tuple[bytes, None]:
        raise ShardError(f"the {self.name!r} serializer is not used by facebench")

    def deserialize(self, data: bytes) -> object:
        raise ShardError(f"the {self.name!r} serializer is not used by facebench")

    def can_serialize(self, item: object) -> bool:
        return False


def serializers() -> dict[str, object]:
    """For StreamingDataset(serializers=...): LitData's own numpy and int serializers, and a
    Refused in place of every other one it has (it fills in its defaults for names left out)."""
    from litdata.streaming.serializers import _SERIALIZERS  # every name LitData would resolve

    return {name: Refused(name) for name in _SERIALIZERS if name not in SERIALIZERS}


# Written by one litdata.optimize call, not shard by shard; items hold resized pixels.
FORMAT = ShardFormat(
    name="litdata",
    suffix=SUFFIX,
    resized=True,
    estimate_bytes=estimate_bytes,
    write_set=write_set,
    writes=writes,
    requires=Requirement("litdata", "litdata"),
    check_set=check_set,
)
