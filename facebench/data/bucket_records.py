"""The samples of a data set in a bucket: the same layouts, records, labels and order as from a
local folder (facebench/data/sources.py, folder.py), found with one paged listing of the prefix.

    s3://bucket/prefix/CelebA/identity_CelebA.txt           fetched, read as the local file
    s3://bucket/prefix/CelebA/img_align_celeba/000001.jpg    named by it
    s3://bucket/prefix/DigiFace1M/<identity>/<n>.png         found in the listing
    s3://bucket/prefix/<class>/.../<image>                   data.layout=folder

A record's path is the object's s3:// address. The listing gives every object's size, so the
existence and emptiness checks cost no request per object, and its ETags stand in for the local
files' modification times in the data's fingerprint.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
from dataclasses import dataclass

from facebench.data.folder import FOLDER, image_extensions, is_image_name
from facebench.data.records import LabelSpace, Record, check_label
from facebench.data.sources import (
    CELEBA,
    CELEBA_IMAGES,
    CELEBA_LABELS,
    DIGIFACE,
    DIGIFACE_SUFFIX,
    Layout,
    parse_identities,
)
from facebench.errors import DataError
from facebench.storage import objects
from facebench.storage.address import Address

log = logging.getLogger(__name__)

_SHARDS = "facebench-shards/"  # shards written under the same prefix are not samples


@dataclass(frozen=True)
class BucketListing:
    """What one listing of the prefix found: each object's size and ETag, by s3:// address."""

    address: Address
    objects: dict[str, tuple[int, str]]  # relative key -> (size, etag)

    def url(self, relative: str) -> str:
        return str(self.address.child(relative))

    def size(self, path: str) -> int | None:
        """An s3:// path's size as listed; None if it was not listed."""
        found = self.objects.get(path[len(str(self.address.child())) :].lstrip("/"))
        return None if found is None else found[0]


def list_prefix(address: Address) -> BucketListing:
    found = {
        entry.key: (entry.size, entry.etag)
        for entry in objects.list_objects(address, log)
        if not entry.key.startswith(_SHARDS)
    }
    log.info("listed %s: %d objects", address, len(found))
    if not found:
        raise DataError(
            f"{address}: no objects under this prefix. Check storage.url, or upload the data "
            "first: python prepare.py storage=s3 storage.url=..."
        )
    return BucketListing(address, found)


def _faces(found: BucketListing) -> tuple[list[Record], LabelSpace]:
    labels_key = f"{CELEBA}/{CELEBA_LABELS}"
    if labels_key not in found.objects:
        raise DataError(
            f"{found.url(labels_key)}: CelebA label file not found. The prefix must hold "
            "CelebA/ and DigiFace1M/ in the layout of docs/loaders.md (or use data.layout=folder)"
        )
    identities = parse_identities(objects.read(found.url(labels_key)), found.url(labels_key))
    digiface: list[tuple[int, str]] = []
    ignored = 0
    for key in found.objects:
        top, _, rest = key.partition("/")
        if top != DIGIFACE or not rest:
            continue
        folder, _, name = rest.partition("/")
        try:
            number = int(folder)
        except ValueError:
            raise DataError(
                f"{found.url(f'{DIGIFACE}/{folder}')}: DigiFace1M folder names are integer "
                "identities; move these objects out of DigiFace1M/"
            ) from None
        if "/" in name or not name.endswith(DIGIFACE_SUFFIX):
            ignored += 1
            continue
        digiface.append((number, name))
    if ignored:
        log.info("%s: ignored %d objects that are not .png", found.url(DIGIFACE), ignored)
    digiface.sort()  # by folder number, then file name: the local listing's order
    n_celeba = max(identity for _, identity in identities)
    if digiface:
        number = digiface[-1][0]
        where = found.url(f"{DIGIFACE}/{number}")
        fix = "Number the identity folders from 0"
        folders = len({n for n, _ in digiface})
        check_label(number, len(identities) + folders, where, "DigiFace1M folder", 0, fix)
    labels = LabelSpace(n_celeba=n_celeba, n_digiface=digiface[-1][0] + 1 if digiface else 0)
    images = f"{CELEBA}/{CELEBA_IMAGES}"
    records = [
        Record(found.url(f"{images}/{name}"), labels.celeba_label(identity), CELEBA)
        for name, identity in identities
    ]
    records += [
        Record(found.url(f"{DIGIFACE}/{number}/{name}"), labels.digiface_label(number), DIGIFACE)
        for number, name in digiface
    ]
    return records, labels


def _class_folders(found: BucketListing) -> tuple[list[Record], LabelSpace]:
    extensions = image_extensions()
    by_class: dict[str, list[tuple[str, str]]] = {}
    ignored = 0
    for key in found.objects:
        top, _, rest = key.partition("/")
        if not rest:
            ignored += 1  # an object beside the class folders
            continue
        if top.startswith("."):
            continue
        if is_image_name(rest, extensions):
            by_class.setdefault(top, []).append(posixpath.split(key))
        else:
            ignored += 1
    classes = sorted(by_class)
    if not classes:
        raise DataError(
            f"{found.address}: no class folders with images. data.layout=folder reads "
            "<prefix>/<class>/<image>"
        )
    if ignored:
        log.info(
            "%s: ignored %d objects that are not images in a class folder", found.address, ignored
        )
    records = [
        Record(found.url(f"{folder}/{name}"), index, FOLDER)
        for index, name_of_class in enumerate(classes)
        # os.walk's order, as the local folder is read: folders by path, files by name
        for folder, name in sorted(by_class[name_of_class])
    ]
    return records, LabelSpace(classes=tuple(classes))


def read_bucket_records(
    address: Address, layout: Layout
) -> tuple[list[Record], LabelSpace, BucketListing]:
    """Every sample under the prefix in canonical order, its label space, and the listing."""
    if layout.kind == "folder" and layout.labels:
        raise DataError(
            f"data.labels={layout.labels}: a labels CSV is read from local folders only; in a "
            "bucket, use class folders (<prefix>/<class>/<image>)"
        )
    found = list_prefix(address)
    records, labels = _class_folders(found) if layout.kind == "folder" else _faces(found)
    return records, labels, found


def bucket_fingerprint(records: list[Record], found: BucketListing) -> str:
    """sha256 over every sample's key, label, size and ETag, as source_fingerprint is over the
    local files' paths, labels, sizes and times: a replaced object changes it."""
    digest = hashlib.sha256()
    prefix = len(str(found.address.child()))
    for record in records:
        relative = record.path[prefix:].lstrip("/")
        size, etag = found.objects.get(relative, (-1, ""))
        digest.update(f"{relative}\t{record.label}\t{size}\t{etag}\n".encode())
    return digest.hexdigest()
