"""Any image-folder data set: class folders, as torchvision's ImageFolder reads them, or a CSV.

    <root>/<class name>/.../<image>     one folder per class; nested folders belong to their
                                        top class folder; any extension PIL reads, any case
    <root>/labels.csv (data.labels)     "path,label" rows, paths relative to the root; integer
                                        labels, or names (sorted names -> indices)

Class folders' names, sorted (as ImageFolder sorts them), give the class indices; names may hold
spaces and non-ASCII letters. The canonical order (a sample's id) is ImageFolder's: classes in
index order, then each class's files as a sorted walk visits them. Files that are not images
(by extension), and files outside any class folder, are ignored and counted. The class-to-index
map travels with every run (results.json, MLflow) and every shard manifest.
"""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path

from PIL import Image

from facebench.data.records import LabelSpace, Record, check_label
from facebench.errors import DataError

log = logging.getLogger(__name__)

FOLDER = "folder"  # Record.source of every folder sample: no source-specific crop


def image_extensions() -> frozenset[str]:
    """Every file extension PIL can open here, lower case with the dot (".jpg", ".webp", ...)."""
    Image.init()
    return frozenset(
        ext.lower() for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN
    )


def is_image_name(name: str, extensions: frozenset[str]) -> bool:
    return os.path.splitext(name)[1].lower() in extensions


def class_folder_of(root: str, path: str) -> str | None:
    """The top folder under root that holds path (its class folder); None for a file in root."""
    parts = os.path.relpath(path, root).split(os.sep, 1)
    return parts[0] if len(parts) == 2 else None


def class_folders(root: Path) -> list[str]:
    """The class folders' names, sorted: their positions are the class indices."""
    if not root.is_dir():
        raise DataError(
            f"data.root={root}: no such folder. Point it at the folder holding one folder per "
            "class (or pass data.labels=labels.csv)"
        )
    names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    names = [name for name in names if not name.startswith(".") and name != "facebench-shards"]
    if not names:
        raise DataError(
            f"{root}: no class folders. data=folder reads <root>/<class>/<image> (or pass "
            "data.labels=labels.csv with path,label rows)"
        )
    return names


def folder_records(root: Path) -> tuple[list[Record], LabelSpace]:
    """Every image under root's class folders, in ImageFolder's order, and the classes."""
    classes = class_folders(root)
    extensions = image_extensions()
    records: list[Record] = []
    ignored = 0
    for index, name in enumerate(classes):
        for folder, subfolders, files in sorted(os.walk(root / name)):
            subfolders.sort()
            for file in sorted(files):
                if is_image_name(file, extensions):
                    records.append(Record(os.path.join(folder, file), index, FOLDER))
                else:
                    ignored += 1
    ignored += sum(1 for entry in os.scandir(root) if entry.is_file())
    if ignored:
        log.info("%s: ignored %d files that are not images in a class folder", root, ignored)
    if not records:
        raise DataError(f"{root}: no images in its class folders ({', '.join(classes[:5])} ...)")
    return records, LabelSpace(classes=tuple(classes))


def csv_records(root: Path, labels_file: str) -> tuple[list[Record], LabelSpace]:
    """The images a labels CSV lists, in its row order, and the classes it names."""
    path = Path(labels_file).expanduser()
    path = path if path.is_absolute() else root / path
    rows = _read_rows(path, root)
    texts = [label for _, label, _ in rows]
    if all(_is_integer(text) for text in texts):
        numbers = [int(text) for text in texts]
        largest = max(range(len(rows)), key=numbers.__getitem__)
        check_label(numbers[largest], len(rows), f"{path}:{rows[largest][2]}")
        classes = tuple(str(number) for number in range(numbers[largest] + 1))
        indices = numbers
    else:
        classes = tuple(sorted(set(texts)))
        position = {name: index for index, name in enumerate(classes)}
        indices = [position[text] for text in texts]
    records = [
        Record(str(root / relative), index, FOLDER)
        for (relative, _, _), index in zip(rows, indices, strict=True)
    ]
    return records, LabelSpace(classes=classes)


def _is_integer(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _read_rows(path: Path, root: Path) -> list[tuple[str, str, int]]:
    """(relative path, label, line) of every row; a 'path,label' header is skipped."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"data.labels={path}: no such file") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start})") from None
    rows: list[tuple[str, str, int]] = []
    seen: dict[str, int] = {}
    for line, fields in enumerate(csv.reader(text.splitlines()), start=1):
        fields = [field.strip() for field in fields]
        if not any(fields) or (line == 1 and [f.lower() for f in fields] == ["path", "label"]):
            continue
        where = f"{path}:{line}"
        if len(fields) != 2 or not fields[0] or not fields[1]:
            raise DataError(f"{where}: expected 'path,label', got {','.join(fields)!r}")
        relative, label = fields
        resolved = (root / relative).resolve()
        if Path(relative).is_absolute() or not resolved.is_relative_to(root.resolve()):
            raise DataError(f"{where}: {relative} is not inside data.root={root}")
        if _is_integer(label) and int(label) < 0:
            raise DataError(f"{where}: label {label} must be 0 or more")
        if relative in seen:
            raise DataError(f"{where}: {relative} is listed again (first on line {seen[relative]})")
        seen[relative] = line
        rows.append((relative, label, line))
    if not rows:
        raise DataError(f"{path}: no 'path,label' rows")
    return rows
