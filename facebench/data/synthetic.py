"""The synthetic stand-in: CelebA- and DigiFace1M-like files written in the real layouts.

Because the stand-in is a real-layout tree on disk, the code that reads real data is the code that
runs and is tested. It is generated once per (size, seed, generator version) into the cache and
reused; a half-written tree is never mistaken for a whole one, because it only takes its final
name, by an atomic rename, once complete.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facebench.data.sources import CELEBA, CELEBA_IMAGES, CELEBA_LABELS, DIGIFACE
from facebench.data.synthetic_images import celeba_like_jpeg, digiface_like_png, folder_image
from facebench.errors import DataError
from facebench.host.parallel import map_in_processes
from facebench.host.progress import progress
from facebench.host.resources import usable_cores

log = logging.getLogger(__name__)

# Bump when the generated files change, so old caches are not reused.
GENERATOR_VERSION = 1
CELEBA_SHARE = 0.22  # 202,599 of 922,599 real images
CELEBA_PER_IDENTITY = 20  # real CelebA: about 20 images per identity
DIGIFACE_PER_IDENTITY = 72  # real DigiFace1M (720k part): 72 per identity
_CHUNK = 500
# Encoded bytes per image on average: 22% CelebA-like JPEGs of 7 KB, 78% DigiFace-like PNGs of
# 20 KB, plus a file system block's slack.
_BYTES_PER_IMAGE = 19_000


@dataclass(frozen=True)
class SyntheticPlan:
    """Which file gets which identity; everything follows from (n_images, seed)."""

    n_images: int
    seed: int

    @property
    def n_celeba(self) -> int:
        return max(1, round(CELEBA_SHARE * self.n_images)) if self.n_images > 1 else 1

    @property
    def n_digiface(self) -> int:
        return self.n_images - self.n_celeba

    @property
    def n_celeba_identities(self) -> int:
        return max(1, math.ceil(self.n_celeba / CELEBA_PER_IDENTITY))

    def celeba_identities(self) -> np.ndarray:
        """1-based identity of each CelebA-like image, in file order, shuffled like the real set."""
        rng = np.random.default_rng([self.seed, GENERATOR_VERSION])
        return 1 + rng.permutation(self.n_celeba) % self.n_celeba_identities

    def digiface_position(self, index: int) -> tuple[int, int]:
        """(folder, image number) of the index-th DigiFace-like image."""
        return divmod(index, DIGIFACE_PER_IDENTITY)


def synthetic_root(cache: Path, n_images: int, seed: int, layout: str = "faces") -> Path:
    kind = "" if layout == "faces" else f"-{layout}"
    return cache / "synthetic" / f"n{n_images}-seed{seed}{kind}-v{GENERATOR_VERSION}"


def ensure_synthetic(
    cache: Path, n_images: int, seed: int = 0, n_procs: int = 0, layout: str = "faces"
) -> Path:
    """The root of a synthetic tree of n_images, generated first if it is not in the cache.

    layout="faces": CelebA/ and DigiFace1M/ as published; "folder": class folders of images of
    mixed sizes, modes and formats (see facebench.data.synthetic_images.folder_image)."""
    root = synthetic_root(cache, n_images, seed, layout)
    if root.is_dir():
        log.info("synthetic data: reusing %s", root)
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = root.parent / f".{root.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    log.info("synthetic data: generating %d images into %s", n_images, root)
    try:
        generate = _generate_folder if layout == "folder" else _generate
        generate(staging, SyntheticPlan(n_images, seed), n_procs or usable_cores())
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)  # a half-written tree keeps nothing
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataError(
                f"{root.parent}: the disk is full while generating {n_images:,} synthetic images "
                f"(about {n_images * _BYTES_PER_IMAGE / 1e9:.1f} GB). Free space, or set "
                "data.cache_dir=/a/disk/with/room"
            ) from None
        raise
    try:
        staging.rename(root)
    except OSError:
        # Another job finished the same tree first; theirs is identical.
        shutil.rmtree(staging, ignore_errors=True)
        if not root.is_dir():
            raise
    return root


def _generate(staging: Path, plan: SyntheticPlan, n_procs: int) -> None:
    images = staging / CELEBA / CELEBA_IMAGES
    images.mkdir(parents=True)
    identities = plan.celeba_identities()
    names = [f"{index + 1:06d}.jpg" for index in range(plan.n_celeba)]
    with open(staging / CELEBA / CELEBA_LABELS, "w", encoding="utf-8") as labels:
        labels.writelines(
            f"{name} {identity}\n" for name, identity in zip(names, identities, strict=True)
        )
    digiface = staging / DIGIFACE
    for folder in range(math.ceil(plan.n_digiface / DIGIFACE_PER_IDENTITY)):
        (digiface / str(folder)).mkdir(parents=True)
    digiface.mkdir(parents=True, exist_ok=True)

    tasks = [
        (CELEBA, str(staging), plan, start, min(start + _CHUNK, plan.n_celeba))
        for start in range(0, plan.n_celeba, _CHUNK)
    ] + [
        (DIGIFACE, str(staging), plan, start, min(start + _CHUNK, plan.n_digiface))
        for start in range(0, plan.n_digiface, _CHUNK)
    ]
    written = map_in_processes(_write_chunk, tasks, n_procs)
    counted = (n for count in written for n in range(count))  # progress in images, not chunks
    for _ in progress(counted, plan.n_images, "generating", "images", log):
        pass


def _write_chunk(task: tuple[str, str, SyntheticPlan, int, int]) -> int:
    source, staging, plan, start, stop = task
    if source == "folder":
        classes = folder_classes(plan.n_images)
        for index in range(start, stop):
            data, extension = folder_image(index % len(classes), index, plan.seed)
            with open(folder_file(staging, classes, index, extension), "wb") as file:
                file.write(data)
    elif source == CELEBA:
        identities = plan.celeba_identities()
        folder = os.path.join(staging, CELEBA, CELEBA_IMAGES)
        for index in range(start, stop):
            data = celeba_like_jpeg(int(identities[index]), index, plan.seed)
            with open(os.path.join(folder, f"{index + 1:06d}.jpg"), "wb") as file:
                file.write(data)
    else:
        for index in range(start, stop):
            identity, number = plan.digiface_position(index)
            data = digiface_like_png(identity, number, plan.seed)
            path = os.path.join(staging, DIGIFACE, str(identity), f"{number}.png")
            with open(path, "wb") as file:
                file.write(data)
    return stop - start


FOLDER_PER_CLASS = 50
# Class folder names: sorted, they give the class indices; spaces and non-ASCII letters on purpose.
_CLASS_NAMES = ("class {:03d}", "façade {:03d}", "ñandú {:03d}", "Ωmega {:03d}")


def folder_classes(n_images: int) -> list[str]:
    """The class folders' names of a synthetic folder set, in generation order."""
    n_classes = max(2, math.ceil(n_images / FOLDER_PER_CLASS))
    return [_CLASS_NAMES[c % len(_CLASS_NAMES)].format(c) for c in range(n_classes)]


def folder_file(root: str, classes: list[str], index: int, extension: str) -> str:
    """Where the index-th image goes: its class folder, every fourth one a level deeper."""
    name = classes[index % len(classes)]
    nested = ("more",) if index % 4 == 3 else ()
    return os.path.join(root, name, *nested, f"img {index:06d}{extension}")


def _generate_folder(staging: Path, plan: SyntheticPlan, n_procs: int) -> None:
    classes = folder_classes(plan.n_images)
    for name in classes:
        (staging / name / "more").mkdir(parents=True)
        (staging / name / "notes.txt").write_text("not an image: ignored\n", encoding="utf-8")
    (staging / "README.txt").write_text("outside any class folder: ignored\n", encoding="utf-8")
    tasks = [
        ("folder", str(staging), plan, start, min(start + _CHUNK, plan.n_images))
        for start in range(0, plan.n_images, _CHUNK)
    ]
    written = map_in_processes(_write_chunk, tasks, n_procs)
    counted = (n for count in written for n in range(count))
    for _ in progress(counted, plan.n_images, "generating", "images", log):
        pass
