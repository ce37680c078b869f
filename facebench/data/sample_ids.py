"""Each sample's canonical position, found from its path.

The canonical order is read_records' order: CelebA in label-file order, then DigiFace1M by folder
number and file name. Loaders report it with every sample so that the epoch can be checked for
gaps and repeats and its shuffle measured. Pipelines that find files themselves (a FileLister)
look the position up here: 8-byte path hashes in a sorted array, about 16 bytes a sample, cheap
to send to every worker.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np


def _key(path: str) -> int:
    # The name's bytes as the OS gives them, whether or not they are UTF-8.
    return int.from_bytes(hashlib.blake2b(os.fsencode(path), digest_size=8).digest(), "little")


class SampleIds:
    def __init__(self, paths: list[str], offset: int = 0) -> None:
        keys = np.fromiter((_key(path) for path in paths), dtype=np.uint64, count=len(paths))
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._positions = (order + offset).astype(np.int64)
        if len(keys) > 1 and np.any(self._keys[1:] == self._keys[:-1]):
            raise ValueError("two sample paths share a hash; cannot index them")

    def __len__(self) -> int:
        return len(self._keys)

    def __call__(self, path: str) -> int:
        key = np.uint64(_key(path))
        at = int(np.searchsorted(self._keys, key))
        if at == len(self._keys) or self._keys[at] != key:
            raise KeyError(f"{path}: not among the samples listed before the epoch")
        return int(self._positions[at])
