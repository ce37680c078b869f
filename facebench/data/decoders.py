"""The decoders a loader that decodes on the CPU can use (`loader.decoder`): each turns a file's
bytes into a sample in two steps, `decode` (bytes -> the RGB image, CelebA cropped to its box)
and `transform` (that image -> the sample), and says what its samples are.

    pil          PIL decodes; the article's transform per sample (Resize, crop, ToTensor,
                 Normalize): normalized float samples, pixel for pixel the article's
    torchvision  torchvision.io for grey and colour JPEGs, PIL for the rest (fast_decode.py);
                 resized to transform.resize on a uint8 tensor: the device crops and
                 normalizes whole batches (facebench.run.finish)
    fast         libspng for 8-bit PNGs, libjpeg-turbo called directly for grey and colour
                 JPEGs, PIL for the rest, counted (fast_codecs.py): PIL's decoded pixels exactly;
                 resized and finished as torchvision's. Needs pip install -e '.[fast]'

Adding a decoder is one entry in `decoder` below (and its name in config.Decoder); every
decoding loader then offers it, timed as its stages by loaders/decoding.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from facebench.config import Decoder as DecoderName
from facebench.data import fast_decode
from facebench.data.images import decode_sample
from facebench.data.transforms import Geometry
from facebench.host.extras import Requirement

# What decoder=fast imports (fast_codecs.py), and the extra that installs it.
FAST_NEEDS = (Requirement("pyspng", "fast"), Requirement("simplejpeg", "fast"))


def require(name: str) -> None:
    """Refuse, with the install command, a decoder whose libraries are missing."""
    if name == DecoderName.fast:
        for requirement in FAST_NEEDS:
            requirement.require(f"loader.decoder={name}")


@dataclass(frozen=True)
class Decoder:
    name: str
    # (bytes, source, name for errors) -> the decoded RGB image, CelebA cropped.
    decode: Callable[[bytes, str, str], Any]
    # The decoded image -> the sample.
    transform: Callable[[Any], torch.Tensor]
    # Whether its samples are normalized floats, the crop made, or uint8 images of
    # transform.resize that the device finishes (facebench.run.finish).
    normalized: bool


def decoder(name: str, transform: Callable[[Any], torch.Tensor], geometry: Geometry) -> Decoder:
    """The decoder `loader.decoder=<name>` names; `transform` is the article's per-sample
    transform (with the run's crop and geometry), for the decoders that apply it."""
    if name == DecoderName.pil:
        return Decoder(name, decode_sample, transform, normalized=True)
    resize = functools.partial(fast_decode.resized, size=geometry.resized)
    if name == DecoderName.torchvision:
        return Decoder(name, fast_decode.decode_rgb, resize, normalized=False)
    if name == DecoderName.fast:
        require(name)
        from facebench.data import fast_codecs  # an optional extra: imported when chosen

        return Decoder(name, fast_codecs.decode_rgb, resize, normalized=False)
    raise ValueError(f"loader.decoder={name}: no such decoder")  # the schema refuses it first
