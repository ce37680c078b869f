"""The article's shard format: pickled lists of (PIL.Image, label, sample id), decoded.

The article stored (image, label); the sample id (canonical position) is added so that epochs can be
checked for gaps and repeats and their shuffle measured, at 8 bytes a sample.

Unpickling runs code named in the file, so a pickle shard is only ever loaded from bytes whose
sha256 matches the manifest facebench wrote (see manifest.read_verified). Never load pickle shards
from anyone else.
"""

from __future__ import annotations

import pickle

from PIL import Image

from facebench.data.images import open_sample
from facebench.data.sources import Record
from facebench.shards import room
from facebench.shards.formats import ShardFormat

_FRAMING_BYTES = 160  # a pickled PIL image's mode, size and class, the label and the id


def encode(samples: list[tuple[int, Record]], resize: int) -> bytes:
    """(sample id, record) pairs -> the pickled shard."""
    decoded = [(open_sample(r.path, r.source), r.label, i) for i, r in samples]
    return pickle.dumps(decoded, protocol=pickle.HIGHEST_PROTOCOL)


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """Each shard's bytes, for shards of these sample counts: decoded pixels, from a sample of
    the images, and pickle's framing of each (image, label, id)."""
    per_sample = room.mean_decoded_bytes(records) + _FRAMING_BYTES
    return [size * per_sample for size in sizes]


def decode(data: bytes) -> list[tuple[Image.Image, int, int]]:
    """A shard's bytes (verified) -> its (image, label, sample id) samples."""
    return pickle.loads(data)


# Decoded images before the transform: transform.resize does not change them.
FORMAT = ShardFormat(
    name="pickle",
    suffix=".pickle",
    resized=False,
    estimate_bytes=estimate_bytes,
    encode=encode,
    per_worker=True,
)
