"""The seed's shard format: a pickled list of (PIL.Image, label), decoded but not augmented.

Unpickling runs code named in the file, so a pickle shard is only ever loaded from bytes whose
sha256 matches the manifest facebench wrote (see manifest.read_verified). Never load pickle shards
from anyone else.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

from PIL import Image

from facebench.data.images import open_sample
from facebench.data.sources import Record

SUFFIX = ".pickle"


def encode(records: list[Record]) -> bytes:
    samples = [(open_sample(r.path, r.source), r.label) for r in records]
    return pickle.dumps(samples, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Iterator[tuple[Image.Image, int]]:
    yield from pickle.loads(data)
