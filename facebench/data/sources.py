"""Where samples come from: CelebA (aligned) and DigiFace1M in their real layouts, with one label
space, or any image folder (facebench/data/folder.py).

    <root>/CelebA/identity_CelebA.txt          "000001.jpg 2880" per line, identities 1-based
    <root>/CelebA/img_align_celeba/000001.jpg  178x218 RGB JPEG
    <root>/DigiFace1M/<identity>/<n>.png        112x112 RGBA PNG

Labels: CelebA identity k -> k - 1; DigiFace folder f -> n_celeba + f, where n_celeba is the largest
CelebA identity. The seed kept CelebA's 1-based identities as labels and offset DigiFace by 10177,
so CelebA identity 10177 and DigiFace folder 0 shared a label; this scheme has no collision.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from facebench.data.records import LabelSpace, Record, check_label
from facebench.errors import DataError

log = logging.getLogger(__name__)

CELEBA = "CelebA"
DIGIFACE = "DigiFace1M"
CELEBA_LABELS = "identity_CelebA.txt"
CELEBA_IMAGES = "img_align_celeba"
DIGIFACE_SUFFIX = ".png"


@dataclass(frozen=True)
class DigiFaceListing:
    files: list[tuple[int, str]]  # (folder number, path), in folder then file-name order
    ignored: int  # files that are not PNG images, skipped by every loader alike


def _require_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise DataError(
            f"{path}: {what} not found. data.root must hold CelebA/ and DigiFace1M/ "
            "in the layout described in docs/loaders.md"
        )


def celeba_identities(root: str | os.PathLike) -> list[tuple[str, int]]:
    """(file name, identity) for every line of identity_CelebA.txt, in file order.

    Tolerates what real copies carry: CRLF line ends, trailing spaces, blank lines and a missing
    final newline. Anything else malformed stops with the file and line number.
    """
    celeba = Path(root) / CELEBA
    _require_dir(Path(root), "data.root")
    _require_dir(celeba, "the CelebA folder")
    labels_path = celeba / CELEBA_LABELS
    if not labels_path.is_file():
        raise DataError(f"{labels_path}: CelebA label file not found")
    return parse_identities(labels_path.read_bytes(), str(labels_path))


def parse_identities(data: bytes, labels_path: str) -> list[tuple[str, int]]:
    """identity_CelebA.txt's lines, as celeba_identities reads them, from its bytes (a local
    file's or an object's); `labels_path` names it in errors."""
    entries: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is tolerated
    except UnicodeDecodeError as error:
        raise DataError(
            f"{labels_path}: not UTF-8 text (byte {error.start}); is this the right file?"
        ) from None
    for line_number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"{labels_path}:{line_number}"
        if len(fields) != 2:
            raise DataError(
                f"{where}: expected '<image name> <identity>', got {line.rstrip()!r}; "
                "fix or remove that line"
            )
        name, identity_text = fields
        try:
            identity = int(identity_text)
        except ValueError:
            raise DataError(
                f"{where}: identity {identity_text!r} is not an integer; fix that line"
            ) from None
        if identity < 1:
            raise DataError(f"{where}: identity {identity} must be 1 or more (1-based)")
        # A name with a separator could point outside data.root.
        if os.sep in name or "/" in name or name in (".", ".."):
            raise DataError(f"{where}: image name {name!r} must be a plain file name")
        if name in seen:
            raise DataError(
                f"{where}: {name} is listed again (first on line {seen[name]}); "
                "remove one of the two lines"
            )
        seen[name] = line_number
        entries.append((name, identity))
    if not entries:
        raise DataError(f"{labels_path}: no labelled images; is this the right file?")
    name, identity = max(entries, key=lambda entry: entry[1])
    where = f"{labels_path}:{seen[name]}"
    check_label(identity, len(entries), where, "identity", 1, "Number the identities from 1")
    return entries


def _digiface_folders(root: str | os.PathLike) -> list[tuple[int, str]]:
    """(identity, path) of every folder in DigiFace1M/, sorted by identity."""
    _require_dir(Path(root), "data.root")
    digiface = Path(root) / DIGIFACE
    _require_dir(digiface, "the DigiFace1M folder")
    folders: list[tuple[int, str]] = []
    with os.scandir(digiface) as entries:
        for entry in entries:
            # Not following links, as os.walk (and so the datapipe loader's FileLister) does not.
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                folders.append((int(entry.name), entry.path))
            except ValueError:
                raise DataError(
                    f"{entry.path}: DigiFace1M folder names are integer identities; "
                    "move this folder out of DigiFace1M/"
                ) from None
    return sorted(folders)


def list_digiface(root: str | os.PathLike) -> DigiFaceListing:
    """Every PNG under DigiFace1M/<integer folder>/, in a fixed order."""
    files: list[tuple[int, str]] = []
    ignored = 0
    for number, folder in _digiface_folders(root):
        for name in sorted(os.listdir(folder)):
            if name.endswith(DIGIFACE_SUFFIX):  # case-sensitive, like the article and FileLister
                files.append((number, os.path.join(folder, name)))
            else:
                ignored += 1
    if ignored:
        log.info("%s: ignored %d files that are not .png", Path(root) / DIGIFACE, ignored)
    return DigiFaceListing(files=files, ignored=ignored)


def _label_space(identities: list[tuple[str, int]], root: str | os.PathLike) -> LabelSpace:
    folders = _digiface_folders(root)
    if folders:
        number, folder = folders[-1]
        fix = "Number the identity folders from 0"
        check_label(number, len(identities) + len(folders), folder, "DigiFace1M folder", 0, fix)
    return LabelSpace(
        n_celeba=max(identity for _, identity in identities),
        n_digiface=folders[-1][0] + 1 if folders else 0,
    )


def celeba_records(
    root: str | os.PathLike, labels: LabelSpace, identities: list[tuple[str, int]] | None = None
) -> list[Record]:
    images = Path(root) / CELEBA / CELEBA_IMAGES
    _require_dir(images, "the CelebA image folder img_align_celeba")
    prefix = str(images)
    return [
        Record(os.path.join(prefix, name), labels.celeba_label(identity), CELEBA)
        for name, identity in (identities or celeba_identities(root))
    ]


def digiface_records(root: str | os.PathLike, labels: LabelSpace) -> list[Record]:
    return [
        Record(path, labels.digiface_label(folder), DIGIFACE)
        for folder, path in list_digiface(root).files
    ]


def digiface_record(path: str, labels: LabelSpace) -> Record:
    """The record of one DigiFace file found by a file lister: label from its folder name."""
    folder = int(os.path.basename(os.path.dirname(path)))
    return Record(path, labels.digiface_label(folder), DIGIFACE)


def read_faces(root: str | os.PathLike) -> tuple[list[Record], LabelSpace]:
    """All samples, CelebA first, then DigiFace1M, with the label space they share."""
    identities = celeba_identities(root)
    labels = _label_space(identities, root)
    records = celeba_records(root, labels, identities) + digiface_records(root, labels)
    return records, labels


@dataclass(frozen=True)
class Layout:
    """How the data under data.root is laid out."""

    kind: str = "faces"  # faces: CelebA/ + DigiFace1M/; folder: class folders, or a labels CSV
    labels: str = ""  # folder only: a "path,label" CSV, relative to the root or absolute


FACES = Layout()


def read_records(
    root: str | os.PathLike, layout: Layout = FACES
) -> tuple[list[Record], LabelSpace]:
    """Every sample in canonical order (its position is its id), with the label space."""
    if layout.kind == "folder":
        from facebench.data.folder import csv_records, folder_records

        folder = Path(root)
        return csv_records(folder, layout.labels) if layout.labels else folder_records(folder)
    return read_faces(root)
