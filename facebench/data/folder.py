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
import errno
import io
import logging
import os
import re
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

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
    if rows[0].integer:
        numbers = [int(row.label) for row in rows]
        largest = max(range(len(rows)), key=numbers.__getitem__)
        check_label(numbers[largest], len(rows), f"{path}:{rows[largest].line}")
        classes = tuple(str(number) for number in range(numbers[largest] + 1))
        indices = numbers
    else:
        classes = tuple(sorted({row.label for row in rows}))
        position = {name: index for index, name in enumerate(classes)}
        indices = [position[row.label] for row in rows]
    records = [
        Record(str(root / row.relative), index, FOLDER)
        for row, index in zip(rows, indices, strict=True)
    ]
    return records, LabelSpace(classes=classes)


# Integer labels are class indices written with the digits 0-9 (int() would also take '+1', ' 1'
# or Arabic-Indic digits; '²' passes str.isdigit but not int()).
_INTEGER = re.compile(r"-?[0-9]+")
_NUMERIC_MARKS = frozenset("+-.,_eE ")


class _Row(NamedTuple):
    relative: str
    label: str
    line: int

    @property
    def integer(self) -> bool:
        return _INTEGER.fullmatch(self.label) is not None


def _label_problem(label: str) -> str | None:
    """Why a label is neither an integer class index nor a class name (a message that starts
    with the label), or None."""
    if _INTEGER.fullmatch(label):
        return f"label {label} must be 0 or more" if int(label) < 0 else None
    numeric = [c.isnumeric() for c in label]
    if any(numeric) and all(n or c in _NUMERIC_MARKS for n, c in zip(numeric, label, strict=True)):
        return (
            f"label {label!r} looks like a number but is not an integer: write class indices "
            "with the digits 0-9"
        )
    if any(unicodedata.category(c).startswith("C") for c in label):
        return f"label {label!r} holds control characters: write a class name or an index"
    return None


def _read_rows(path: Path, root: Path) -> list[_Row]:
    """Every 'path,label' row (a 'path,label' header is skipped), each checked; any row that
    cannot be used is named, file:line, before any work."""
    rows: list[_Row] = []
    seen: dict[Path, int] = {}
    for line, fields in _csv_lines(path):
        fields = [field.strip() for field in fields]
        if not any(fields) or (not rows and [f.lower() for f in fields] == ["path", "label"]):
            continue
        where = f"{path}:{line}"
        if len(fields) != 2 or not fields[0] or not fields[1]:
            raise DataError(f"{where}: expected 'path,label', got {','.join(fields)!r}")
        relative, label = fields
        problem = _label_problem(label)
        if problem:
            raise DataError(f"{where}: {problem}")
        resolved = _checked_path(root, relative, where)
        if resolved in seen:
            raise DataError(f"{where}: {relative} is listed again (first on line {seen[resolved]})")
        seen[resolved] = line
        row = _Row(relative, label, line)
        if rows and row.integer != rows[0].integer:
            kinds = ("an integer", "a name") if rows[0].integer else ("a name", "an integer")
            raise DataError(
                f"{where}: label {label!r} is {kinds[1]}, but line {rows[0].line}'s is "
                f"{kinds[0]} ({rows[0].label!r}): give every row an integer class index (0, 1, "
                "2, ...) or every row a class name"
            )
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no 'path,label' rows")
    return rows


def _csv_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each row of the labels CSV."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"data.labels={path}: no such file") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise DataError(f"data.labels={path}: cannot be read ({error.strerror})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise DataError(f"{path}:{reader.line_num}: not a CSV row ({error})") from None
        yield reader.line_num, fields


def _checked_path(root: Path, relative: str, where: str) -> Path:
    """The row's file inside root; a path outside it, a folder, or one the system cannot use is
    named. A missing file is left to the check every run makes (on_bad_sample decides)."""
    candidate = root / relative
    resolved = candidate.resolve()
    if Path(relative).is_absolute() or not resolved.is_relative_to(root.resolve()):
        raise DataError(f"{where}: {relative} is not inside data.root={root}")
    try:
        if stat.S_ISDIR(candidate.stat().st_mode):
            raise DataError(f"{where}: {relative} is a folder, not an image file")
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise DataError(f"{where}: {relative} cannot be used ({error.strerror})") from None
    return resolved
