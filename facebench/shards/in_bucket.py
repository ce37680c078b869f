"""Shard sets under an s3:// prefix: uploaded by prepare.py storage=s3, trusted by train.py.

    <storage.url>/facebench-shards/<format>/   (the set's files, manifest.json written last)

prepare.py builds a set locally, from the same data set it uploads, then uploads the set's files
(storage/sync.py: resumable, never touching objects facebench did not write). The manifest it
uploads is the local one with what the set was made from restated for the bucket: the objects'
fingerprint (keys, labels, sizes and ETags, as train.py lists them) and the left-out samples'
addresses. It is written after every shard and removed before any changes, so a manifest in a
bucket never vouches for shards that are not there.

train.py never builds shards in a bucket: it checks the set there against its own listing and
settings, and where it does not match says which prepare.py uploads the right one.
"""

from __future__ import annotations

import dataclasses
import logging

from facebench.config.schema import ROW_GROUP_SIZE
from facebench.data.listing import Listing
from facebench.errors import ShardError
from facebench.shards import formats
from facebench.shards.build import ShardSet, sized_for
from facebench.shards.formats import resize_of
from facebench.shards.freshness import left_out, settings_for
from facebench.shards.manifest import MANIFEST, Manifest
from facebench.storage.address import parse
from facebench.storage.sync import Uploaded, upload_tree

log = logging.getLogger(__name__)

SHARDS = "facebench-shards"  # beside the data set; its listing leaves this prefix out


def bucket_folder(url: str, format_name: str) -> str:
    """Where a set of this format lives under the data's prefix."""
    return str(parse(url).child(SHARDS, format_name))


def _as_uploaded(manifest: Manifest, listing: Listing) -> Manifest:
    """The local set's manifest, saying what it was made from in the bucket's terms."""
    settings = {**manifest.settings, "skipped": left_out(listing.usable.excluded)}
    return dataclasses.replace(manifest, source_fingerprint=listing.fingerprint, settings=settings)


def upload_set(shard_set: ShardSet, listing: Listing, url: str) -> Uploaded:
    """Upload a local set, built from the data set listed under url, beside it."""
    manifest = shard_set.manifest
    if len(listing.usable.records) != manifest.n_samples:
        raise ShardError(
            f"{shard_set.folder} holds {manifest.n_samples:,} samples, but {url} lists "
            f"{len(listing.usable.records):,} usable ones: they are not the same data set. "
            "Upload the data again (python prepare.py storage=s3 ...) and rerun"
        )
    files = [shard.name for shard in manifest.shards]
    files += [shard.index_name for shard in manifest.shards if shard.index_sha256]
    destination = bucket_folder(url, manifest.format)
    last = {MANIFEST: _as_uploaded(manifest, listing).encoded()}
    log.info("uploading %d shard files of %s to %s", len(files), shard_set.folder, destination)
    return upload_tree(shard_set.folder, parse(destination), files=files, last=last)


def trusted_bucket_set(
    folder: str,
    listing: Listing,
    format_name: str,
    seed: int,
    shard_size: int,
    resize: int,
    readers: int,
    batch_size: int,
    row_group_size: int = ROW_GROUP_SIZE,
) -> Manifest:
    """The set under folder, if it was made from these objects with these settings and every
    shard is there at its size (one listing); else refused with the prepare.py that fixes it."""
    upload = (
        f"python prepare.py storage=s3 format={format_name} storage.url=... with this run's data "
        "overrides"
    )
    manifest = Manifest.read(folder)
    if manifest is None:
        raise ShardError(f"{folder}: no shard set there (no {MANIFEST}). Upload one: {upload}")
    if formats.get(format_name).per_worker:
        built = int(manifest.settings["shard_size"])
        n_samples = len(listing.usable.records)
        # prepare.py cuts for up to SERVED_READERS workers, not knowing this run's: the size it
        # chose for this shard_size serves this run too where every reader gets a shard.
        for_run = sized_for(n_samples, shard_size, readers, batch_size, format_name, built)
        prepared = sized_for(n_samples, shard_size, None, batch_size, format_name, built)
        serves = built == prepared and -(-n_samples // built) >= readers
        shard_size = built if serves else for_run
    skipped = sorted(listing.usable.excluded)
    wanted = settings_for(format_name, seed, shard_size, skipped, resize, row_group_size)
    if manifest.source_fingerprint != listing.fingerprint:
        raise ShardError(
            f"{folder}: made from other objects than those listed now under the prefix (added, "
            f"replaced or deleted since). Upload it again: {upload}"
        )
    keys = {*wanted, *manifest.settings}
    differing = sorted(key for key in keys if manifest.settings.get(key) != wanted.get(key))
    for key in ("shard_size", "row_group_size"):  # say the values this run needs
        if key in differing and key in wanted:
            upload = upload.replace(" storage.url=", f" {key}={wanted[key]} storage.url=")
    if differing:
        shown = ", ".join(
            f"{key} {manifest.settings.get(key)} (this run: {wanted.get(key)})" for key in differing
        )
        raise ShardError(f"{folder}: built with other settings: {shown}. Upload again: {upload}")
    wrong = manifest.missing_or_resized(folder)
    if wrong:
        raise ShardError(
            f"{folder}/{wrong[0]}: missing or not the size its manifest records "
            f"({len(wrong)} such objects). Upload again: {upload}"
        )
    log.info(
        "shards in %s: %d shards, %d samples, resize %d",
        folder, len(manifest.shards), manifest.n_samples, resize_of(manifest.settings),
    )  # fmt: skip
    return manifest
