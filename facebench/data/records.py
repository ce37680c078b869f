"""What a sample is to every loader: a file, its class, its source; and the classes there are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from facebench.errors import DataError

# A model gets one output per class index up to the largest label, and the class map one entry:
# a label far above the number of samples (a typo, an id column) would size both by its value
# (one CSV row with 999999999 grew a run to 14 GB). Labels below this, or below the number of
# samples when that is larger, are accepted.
LABEL_BOUND = 100_000


def check_label(
    value: int,
    n_samples: int,
    where: str,
    what: str = "label",
    first: int = 0,
    fix: str = "Number the classes from 0, or give them names",
) -> None:
    """Refuse a class number so large that the classes would be counted by its value; `first`
    is the number of the first class (CelebA's identities start at 1)."""
    bound = max(n_samples, LABEL_BOUND)
    if value - first >= bound:
        raise DataError(
            f"{where}: {what} {value} is too large: classes are counted up to the largest one, "
            f"and {n_samples:,} samples allow at most {bound - 1 + first:,}. {fix}"
        )


class Record(NamedTuple):
    """One sample: where its file is, its class, and which source it comes from."""

    path: str
    label: int
    source: str


@dataclass(frozen=True)
class LabelSpace:
    """The classes: CelebA + DigiFace1M's identities, or a folder data set's named classes."""

    n_celeba: int = 0  # the largest CelebA identity: CelebA labels are 0 .. n_celeba - 1
    n_digiface: int = 0  # the largest DigiFace folder number + 1
    classes: tuple[str, ...] = ()  # folder data: each class's name, by index

    @property
    def n_classes(self) -> int:
        return len(self.classes) if self.classes else self.n_celeba + self.n_digiface

    def class_map(self) -> dict[str, int]:
        """Class name -> index, for folder data (faces follow the rule in data/sources.py)."""
        return {name: index for index, name in enumerate(self.classes)}

    def celeba_label(self, identity: int) -> int:
        return identity - 1

    def digiface_label(self, folder: int) -> int:
        return self.n_celeba + folder
