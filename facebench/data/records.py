"""What a sample is to every loader: a file, its class, its source; and the classes there are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


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
