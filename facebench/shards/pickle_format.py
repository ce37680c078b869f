"""The article's shard format: pickled lists of (PIL.Image, label, sample id), decoded.

The article stored (image, label); the sample id (canonical position) is added so that epochs can be
checked for gaps and repeats and their shuffle measured, at 8 bytes a sample.

Unpickling a file runs whatever callables it names, so a pickle shard is read the way
torch.load(weights_only=True) reads a checkpoint: by an unpickler that resolves exactly the one
class facebench writes (PIL.Image.Image, whose state is plain bytes, ints and strings) and refuses
any other name before it is looked up, let alone called. A shard is also only unpickled from bytes
whose sha256 matches its manifest (manifest.read_verified), which catches damage; the restricted
unpickler is what stops a shard that someone else wrote, manifest and all, from running code.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from PIL import Image

from facebench.data.images import open_sample
from facebench.data.sources import Record
from facebench.errors import ShardError
from facebench.shards import room
from facebench.shards.formats import Settings, ShardFormat

_FRAMING_BYTES = 160  # a pickled PIL image's mode, size and class, the label and the id
# The only global a pickle shard names: the image class. Its state (info, mode, size, palette,
# pixels) holds nothing else once `info` is emptied (encode), which PIL would otherwise fill with
# objects of its plugins (EXIF rationals, PNG text chunks).
_ALLOWED = {("PIL.Image", "Image"): Image.Image}


class UnsafeShard(ShardError):
    """A pickle shard that names something facebench never writes into one."""


def encode(samples: list[tuple[int, Record]], settings: Settings) -> bytes:
    """(sample id, record) pairs -> the pickled shard."""
    decoded = []
    for sample_id, record in samples:
        image = open_sample(record.path, record.source)
        image.info = {}  # file metadata, unused by the transform; see _ALLOWED
        decoded.append((image, int(record.label), int(sample_id)))
    return pickle.dumps(decoded, protocol=pickle.HIGHEST_PROTOCOL)


def estimate_bytes(sizes: list[int], records: list[Record], resize: int) -> list[float]:
    """Each shard's bytes, for shards of these sample counts: decoded pixels, from a sample of
    the images, and pickle's framing of each (image, label, id)."""
    per_sample = room.mean_decoded_bytes(records) + _FRAMING_BYTES
    return [size * per_sample for size in sizes]


class _ShardUnpickler(pickle.Unpickler):
    """Resolves the image class and nothing else. Every opcode that could call something
    (REDUCE, NEWOBJ, INST, OBJ, extension codes) gets its callable from find_class, so with this
    one refusing, the only code a shard can reach is PIL.Image.Image's own: making an empty image
    and setting its state. Persistent ids are refused by pickle.Unpickler itself."""

    def __init__(self, data: bytes, path: str) -> None:
        super().__init__(io.BytesIO(data))
        self.path = path

    def find_class(self, module: str, name: str) -> type:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise UnsafeShard(refusal(self.path, f"{module}.{name}"))
        return allowed


def refusal(path: str, what: str) -> str:
    return (
        f"{path}: holds {what}, which facebench never writes into a pickle shard; refused "
        "before anything in it ran (unpickling runs what a pickle names). Use only pickle "
        f"shards you built: delete {Path(path).parent} and rebuild with python prepare.py "
        "format=pickle, or share raw or tar shards, which cannot run code"
    )


def decode(data: bytes, path: str) -> list[tuple[Image.Image, int, int]]:
    """A shard's bytes (verified) -> its (image, label, sample id) samples; a shard that names
    anything but PIL's image class, or is not a list of such samples, is refused."""
    try:
        samples = _ShardUnpickler(data, path).load()
    except UnsafeShard:
        raise
    except Exception as error:  # anything a malformed pickle makes the unpickler raise
        raise ShardError(
            f"{path}: not a pickle shard facebench wrote ({type(error).__name__}: {error}). "
            "Rebuild: python prepare.py format=pickle"
        ) from None
    if not isinstance(samples, list) or not all(_is_sample(sample) for sample in samples):
        raise UnsafeShard(refusal(path, "something other than a list of (image, label, id)"))
    return samples


def _is_sample(sample: object) -> bool:
    return (
        type(sample) is tuple
        and len(sample) == 3
        and type(sample[0]) is Image.Image
        and type(sample[1]) is int
        and type(sample[2]) is int
    )


# Decoded images before the transform: transform.resize does not change them.
FORMAT = ShardFormat(
    name="pickle",
    suffix=".pickle",
    resized=False,
    estimate_bytes=estimate_bytes,
    encode=encode,
    per_worker=True,
)
