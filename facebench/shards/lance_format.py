"""A Lance dataset of the original encoded images: the same columns as the Parquet shards (id,
label, source, path, image bytes), written by pylance, one fragment (a data file) per
`shard_size` samples.

Lance reads any row at random without a row group's scan: a take of one row reads that row's
pages only. The shard folder is the Lance dataset itself (its data/, _versions/ and
_transactions/ folders, beside facebench's manifest): `lance.dataset(folder)` opens it.

It is written once, whole, in the shuffled order (lance.write_dataset from a stream of record
batches, so the images are never all in memory), as version 1 in Lance's file format
FILE_VERSION. A dataset changed since (appended to, another version, another schema or file
format) is refused before a loader reads it (check_set): facebench measures the set it wrote.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from facebench.data.records import Record
from facebench.errors import ShardError
from facebench.host.extras import Requirement
from facebench.shards import parquet_format, room
from facebench.shards.formats import Settings, ShardFormat
from facebench.shards.manifest import Folder, Manifest, ShardEntry, file_sha256
from facebench.storage import client
from facebench.storage.address import in_bucket

if TYPE_CHECKING:  # pyarrow and lance are imported where they are used
    import pyarrow as pa
    from lance import LanceDataset

# Lance warns at every fork of a process that loaded it. facebench reads Lance only in the job
# itself and in workers started from a forkserver (loaders/lance.py), never in a forked child:
# the warning would only mislead (a sweep's next loader forks its workers from the same job).
warnings.filterwarnings("ignore", message="lance is not fork-safe")

# Lance's file format, fixed rather than "stable" so that a newer pylance writes the same set.
FILE_VERSION = "2.1"
VERSION = 1  # a dataset written once, never appended to
FOLDERS = ("data", "_versions", "_transactions")  # the top-level names Lance writes
_BATCH_ROWS = 256  # rows per record batch handed to the writer: its memory, not the layout
_REBUILD = "python prepare.py format=lance"


def writes(name: str) -> bool:
    """Whether lance.write_dataset may write a top-level entry of this name."""
    return name in FOLDERS


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """The set's bytes: the encoded files, their columns' pages, and Lance's metadata."""
    return [float(room.mean_file_bytes(records) + 64) * sum(sizes) + 4096 * len(sizes)]


def _batches(samples: list[tuple[int, Record]]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    for start in range(0, len(samples), _BATCH_ROWS):
        chunk = samples[start : start + _BATCH_ROWS]
        yield pa.record_batch(
            [
                pa.array([sample_id for sample_id, _ in chunk], pa.int64()),
                pa.array([record.label for _, record in chunk], pa.int64()),
                pa.array([record.source for _, record in chunk], pa.string()),
                pa.array([os.fsencode(record.path) for _, record in chunk], pa.binary()),
                pa.array([Path(record.path).read_bytes() for _, record in chunk], pa.binary()),
            ],
            schema=parquet_format.schema(),
        )


def write_set(
    samples: list[tuple[int, Record]], folder: Path, n_procs: int, cache: Path, settings: Settings
) -> list[ShardEntry]:
    """Every sample (in this order) into a new Lance dataset at folder, in fragments of
    shard_size rows; its files, as manifest entries (each data file with its row count)."""
    import lance
    import pyarrow as pa

    schema = parquet_format.schema()
    reader = pa.RecordBatchReader.from_batches(schema, _batches(samples))
    dataset = lance.write_dataset(
        reader,
        str(folder),
        schema=schema,
        mode="create",
        max_rows_per_file=int(settings["shard_size"]),
        data_storage_version=FILE_VERSION,
    )
    rows = {
        f"data/{data_file.path}": fragment.count_rows()
        for fragment in dataset.get_fragments()
        for data_file in fragment.data_files()
    }
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        size = path.stat().st_size
        found.append(ShardEntry(name, rows.get(name, 0), size, file_sha256(path), ""))
    return found


def check_set(folder: Folder, manifest: Manifest) -> None:
    """Refuse a dataset that is not the one facebench wrote: another version (appended to,
    overwritten), file format or schema, or fragments the manifest does not name."""
    dataset = open_dataset(str(folder))
    where = f"{folder} (Lance dataset)"
    problems = []
    if dataset.version != VERSION:
        problems.append(f"version {dataset.version}, not {VERSION} (changed since it was built)")
    if dataset.data_storage_version != FILE_VERSION:
        problems.append(f"Lance file format {dataset.data_storage_version}, not {FILE_VERSION}")
    if not dataset.schema.equals(parquet_format.schema()):
        problems.append(f"columns {dataset.schema.names} of other types or names")
    named = {entry.name for entry in manifest.shards}
    foreign = [
        f"data/{data_file.path}"
        for fragment in dataset.get_fragments()
        for data_file in fragment.data_files()
        if f"data/{data_file.path}" not in named
    ]
    if foreign:
        problems.append(f"{len(foreign)} data file(s) its manifest does not name ({foreign[0]})")
    if problems:
        raise ShardError(
            f"{where}: {'; '.join(problems)}: not the set facebench wrote. Rebuild: {_REBUILD}"
        )


def storage_options(uri: str) -> dict[str, str] | None:
    """Lance's object_store options for a dataset in a bucket (None for a local folder)."""
    if not in_bucket(uri):
        return None
    import boto3

    endpoint = client.configured()
    found = boto3.session.Session(profile_name=endpoint.profile or None).get_credentials()
    options = {
        "aws_region": endpoint.region,
        "aws_virtual_hosted_style_request": str(not endpoint.path_style).lower(),
        "allow_http": "true",
        "connect_timeout": "3s",
        "timeout": "30s",
        "client_max_retries": str(max(endpoint.attempts - 1, 0)),
    }
    if endpoint.address:
        options["aws_endpoint"] = endpoint.address.rstrip("/")
    if found is not None:
        frozen = found.get_frozen_credentials()
        options["aws_access_key_id"] = frozen.access_key
        options["aws_secret_access_key"] = frozen.secret_key
        if frozen.token:
            options["aws_session_token"] = frozen.token
    return options


def open_dataset(uri: str, options: dict[str, str] | None = None) -> LanceDataset:
    """The Lance dataset at uri (a folder, or an s3:// prefix read with `options`, by default
    the job's endpoint's), or one line saying why not."""
    import lance

    if options is None:
        options = storage_options(uri)
    try:
        return lance.dataset(uri, storage_options=options)
    except (OSError, ValueError, RuntimeError) as error:  # pylance's errors for a bad dataset
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        fix = f"Rebuild: {_REBUILD}"
        if options is not None:
            fix = (
                "Check storage.endpoint, storage.region and the credentials, or upload it: "
                f"{_REBUILD} storage=s3"
            )
        raise ShardError(f"{uri}: Lance cannot open this dataset ({first}). {fix}") from None


# Written by one lance.write_dataset call, not shard by shard: a fragment per shard_size rows.
FORMAT = ShardFormat(
    name="lance",
    suffix=".lance",
    resized=False,
    estimate_bytes=estimate_bytes,
    write_set=write_set,
    writes=writes,
    requires=Requirement("lance", "lance"),
    check_set=check_set,
)
