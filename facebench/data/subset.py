"""A subset of a data set, in its own layout, for measurements that cannot read all of it.

`facebench.advise` measures every loader within a few minutes; building shards of 922,599 images
alone takes longer. So it measures on a subset: n records drawn at random, whose files are linked
(not copied) into a tree of the same layout under the cache, which every loader and shard builder
reads like any other. What it finds per image holds for the whole set, page cache aside: a
sample fits in memory where the whole set may not.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from facebench.data.sources import (
    CELEBA,
    CELEBA_IMAGES,
    CELEBA_LABELS,
    DIGIFACE,
    FACES,
    LabelSpace,
    Layout,
    Record,
    celeba_identities,
)

log = logging.getLogger(__name__)


def subset_tree(
    root: Path,
    records: list[Record],
    n: int,
    cache: Path,
    seed: int = 0,
    layout: Layout = FACES,
    labels: LabelSpace | None = None,
) -> Path:
    """A tree of n of the records (all of them when there are fewer), linking to their files.

    Folder data keeps every class folder (empty where no image was drawn), so class indices stay
    the same; a labels CSV is written anew as `labels.csv` for the sample."""
    if n >= len(records):
        return root
    what = f"{root.resolve()}\t{n}\t{seed}\t{layout.kind}\t{layout.labels}"
    place = hashlib.sha256(os.fsencode(what)).hexdigest()[:16]
    # Keyed by every record's path and label too: links follow a file's new bytes, but a label
    # changed or an image renamed would otherwise be sampled as it was.
    listed = hashlib.sha256()
    for record in records:
        listed.update(os.fsencode(f"{record.path}\t{record.label}\n"))
    target = cache / "samples" / f"{place}-{listed.hexdigest()[:16]}-n{n}"
    if target.is_dir():
        return target
    chosen = sorted(np.random.default_rng(seed).choice(len(records), n, replace=False).tolist())
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    log.info("sampling %d of %d images into %s (links to the originals)", n, len(records), target)
    if layout.kind == "folder":
        _write_folder(staging, root, [records[i] for i in chosen], layout, labels or LabelSpace())
    else:
        _write(staging, root, [records[i] for i in chosen])
    try:
        staging.rename(target)
    except OSError:  # another process finished the same sample first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write(staging: Path, root: Path, records: list[Record]) -> None:
    images = staging / CELEBA / CELEBA_IMAGES
    images.mkdir(parents=True)
    (staging / DIGIFACE).mkdir()
    identities = dict(celeba_identities(root))
    lines = []
    for record in records:
        relative = _link(staging, root, record)
        if record.source == CELEBA:
            lines.append(f"{relative.name} {identities[relative.name]}\n")
    (staging / CELEBA / CELEBA_LABELS).write_text("".join(lines), encoding="utf-8")


def _write_folder(
    staging: Path, root: Path, records: list[Record], layout: Layout, labels: LabelSpace
) -> None:
    staging.mkdir(parents=True)
    for name in labels.classes if not layout.labels else ():
        (staging / name).mkdir()
    rows = ["path,label\n"]
    for record in records:
        relative = _link(staging, root, record)
        rows.append(f'"{relative.as_posix()}",{labels.classes[record.label]}\n')
    if layout.labels:
        (staging / "labels.csv").write_text("".join(rows), encoding="utf-8")


def _link(staging: Path, root: Path, record: Record) -> Path:
    """A link in staging, at the record's place relative to root, to its file; that place."""
    relative = Path(record.path).relative_to(root)
    link = staging / relative
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.abspath(record.path), link)
    return relative
