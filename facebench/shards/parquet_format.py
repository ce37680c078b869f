"""Parquet shards, as image sets ship on the Hugging Face Hub: one file per shard of the original
encoded image bytes with their sample id, label, source and path, in row groups of
`row_group_size` samples, written by pyarrow.

The row group is what a read of one sample costs: Parquet compresses and fetches a column
chunk per row group, so a random read (the map-style loader) reads and decompresses a whole row
group for one image, and a scan (the streaming loader) reads them in order. Columns keep
pyarrow's default compression (Snappy), as the Hub's files do, though image bytes barely shrink.

Like the tar shards, decoding happens at train time, in the loader's workers; each shard also
has its (id, label) index, so a build is resumed and a shard checked as the others are.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

from facebench.data.records import Record
from facebench.errors import ShardError
from facebench.shards import room
from facebench.shards.formats import Settings, ShardFormat
from facebench.shards.manifest import Folder, Manifest, entry_path
from facebench.storage import client
from facebench.storage.address import in_bucket

if TYPE_CHECKING:  # pyarrow is imported where it is used
    import pyarrow as pa
    import pyarrow.parquet as pq

# The columns facebench writes and its loaders read, in this order.
COLUMNS = ("id", "label", "source", "path", "image")
_REBUILD = "python prepare.py format=parquet"
_ROW_GROUP_BYTES = 1024  # each row group's column-chunk headers and statistics
_FOOTER_BYTES = 4096
_TAIL_BYTES = 64 * 2**10  # an object's tail read for its footer: most footers in one GET


def schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.int64()),
            ("label", pa.int64()),
            ("source", pa.string()),
            ("path", pa.binary()),  # any name the OS holds, as its bytes
            ("image", pa.binary()),
        ]
    )


def encode(samples: list[tuple[int, Record]], settings: Settings) -> bytes:
    """(sample id, record) pairs -> one Parquet file of their encoded images, in that order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = []
    for _, record in samples:
        with open(record.path, "rb") as file:
            images.append(file.read())
    table = pa.table(
        [
            pa.array([sample_id for sample_id, _ in samples], pa.int64()),
            pa.array([record.label for _, record in samples], pa.int64()),
            pa.array([record.source for _, record in samples], pa.string()),
            pa.array([os.fsencode(record.path) for _, record in samples], pa.binary()),
            pa.array(images, pa.binary()),
        ],
        schema=schema(),
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=int(settings["row_group_size"]))
    return buffer.getvalue()


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """Each shard's bytes: the source files (from a sample of them), ids, labels and paths, the
    row groups' metadata and the footer (row groups of the default size: an upper bound for
    larger ones)."""
    per_sample = room.mean_file_bytes(records) + 64
    return [
        size * per_sample + -(-size // 100) * _ROW_GROUP_BYTES + _FOOTER_BYTES for size in sizes
    ]


def check_columns(found: object, where: str) -> None:
    """Refuse a Parquet file (or a Hugging Face dataset over one) without facebench's columns,
    naming the file and what to do."""
    names = list(getattr(found, "names", None) or getattr(found, "column_names", None) or [])
    missing = [column for column in COLUMNS if column not in names]
    if missing:
        raise ShardError(
            f"{where}: has no column {', '.join(missing)} (it has {', '.join(names) or 'none'}); "
            f"not a Parquet shard facebench wrote. Rebuild: {_REBUILD}"
        )


def check_set(folder: Folder, manifest: Manifest) -> None:
    """Refuse, before a loader reads them, files that are not the Parquet shards facebench
    wrote: each file's footer read (one ranged GET in a bucket) and its columns, rows and row
    groups compared with the manifest's."""
    row_group_size = int(manifest.settings["row_group_size"])
    for shard in manifest.shards:
        where = str(entry_path(folder, shard.name))
        metadata = _footer(where, shard.bytes)
        check_columns(metadata.schema.to_arrow_schema(), where)
        groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        if metadata.num_rows != shard.samples or any(n > row_group_size for n in groups):
            raise ShardError(
                f"{where}: holds {metadata.num_rows} rows in row groups of up to "
                f"{max(groups, default=0)}, not the {shard.samples} rows in groups of "
                f"{row_group_size} its manifest records. Rebuild: {_REBUILD}"
            )


def _footer(where: str, size: int) -> pq.FileMetaData:
    """A Parquet file's footer: read from the file, or from its object's tail (one ranged GET:
    the footer's bytes behind the magic number a reader checks)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if not in_bucket(where):
            return pq.read_metadata(where)
        tail = client.get(where, (max(0, size - _TAIL_BYTES), size)).data
        footer = int.from_bytes(tail[-8:-4], "little") + 8
        if footer > len(tail) and footer <= size:
            tail = client.get(where, (size - footer, size)).data
        return pq.read_metadata(pa.py_buffer(b"PAR1" + tail[-footer:]))
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise ShardError(
            f"{where}: not a readable Parquet file ({str(error).strip() or error!r}): "
            f"truncated or damaged. Rebuild: {_REBUILD}"
        ) from None


# The original files, as the tar shards hold them: transform.resize does not change them.
FORMAT = ShardFormat(
    name="parquet",
    suffix=".parquet",
    resized=False,
    estimate_bytes=estimate_bytes,
    encode=encode,
    # The streaming loader's workers each read whole files of their own (the map-style one
    # reads any row from any file, so it needs no such cut, but one set serves both).
    per_worker=True,
    row_groups=True,
    check_set=check_set,
)
