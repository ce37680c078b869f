"""decoder=fast: libspng and libjpeg-turbo called directly give PIL's decoded pixels, sample by
sample, bit for bit; what they cannot decode identically goes to PIL and is counted; broken
files and data.max_pixels end as they do with PIL."""

from __future__ import annotations

import io
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from facebench import stages
from facebench.config import DataConfig
from facebench.data import decoders, fast_codecs
from facebench.data.images import BadImage, decode_sample, read_file, set_max_pixels
from facebench.data.sources import CELEBA, DIGIFACE
from facebench.errors import ConfigError
from tests.helpers import prepared
from tests.odd_images import celeba_variants, digiface_variants, variants_tree

# The variants PIL decodes in its own way (tests/odd_images.py): a CMYK JPEG, a WebP and a BMP
# under .jpg names, 16-bit grey and 16-bit RGB PNGs.
CELEBA_FALLBACKS = {4, 9, 10}  # positions in celeba_variants()
DIGIFACE_FALLBACKS = {1, 2}  # positions in digiface_variants()


def _pil(data: bytes, source: str) -> np.ndarray:
    return np.asarray(decode_sample(data, source, "sample"))


def _fast(data: bytes, source: str) -> tuple[np.ndarray, int]:
    """The fast decoder's (H, W, 3) pixels, and how many images it handed to PIL."""
    stages.begin_epoch(True)
    image = fast_codecs.decode_rgb(data, source, "sample")
    times = stages.take()
    assert times is not None
    return image.permute(1, 2, 0).numpy(), times.fallbacks


def _outcome(decode, data: bytes, source: str) -> tuple[str, object]:
    """What decoding ends in: its pixels, or the error's type and message."""
    try:
        pixels = decode(data, source)
    except BadImage as error:
        # PIL names the buffer it was given by its address, which differs from call to call.
        return "error", re.sub(r" object at 0x[0-9a-f]+", " object", str(error))
    pixels = pixels[0] if isinstance(pixels, tuple) else pixels
    return "pixels", (pixels.shape, pixels.tobytes())


def test_synthetic_set_decodes_to_pils_pixels_with_no_fallback(synthetic_root: Path):
    celeba = sorted((synthetic_root / CELEBA / "img_align_celeba").glob("*.jpg"))
    digiface = sorted((synthetic_root / DIGIFACE).glob("*/*.png"))
    assert celeba and digiface
    for path, source in [(p, CELEBA) for p in celeba] + [(p, DIGIFACE) for p in digiface]:
        data = read_file(str(path))
        assert fast_codecs.decode_direct(data, str(path)) is not None, path
        pixels, fallbacks = _fast(data, source)
        assert fallbacks == 0
        np.testing.assert_array_equal(pixels, _pil(data, source), err_msg=str(path))


@pytest.mark.parametrize(
    ("source", "index"),
    [(CELEBA, i) for i in range(len(celeba_variants()))]
    + [(DIGIFACE, i) for i in range(len(digiface_variants()))],
)
def test_every_odd_image_gives_pils_pixels_and_fallbacks_are_counted(source, index):
    data = (celeba_variants() if source == CELEBA else digiface_variants())[index]
    pixels, fallbacks = _fast(data, source)
    np.testing.assert_array_equal(pixels, _pil(data, source))
    falls_back = index in (CELEBA_FALLBACKS if source == CELEBA else DIGIFACE_FALLBACKS)
    assert fallbacks == int(falls_back)
    assert (fast_codecs.decode_direct(data) is None) == falls_back


def _png_with_bad_checksum() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr_crc = 8 + 8 + 13  # signature, IHDR's length and type, its 13 bytes: then its CRC
    data[ihdr_crc] ^= 0xFF
    return bytes(data)


def _png_with_damaged_pixels() -> bytes:
    """A valid PNG structure whose compressed pixels are not zlib data."""
    raw = b"".join(b"\x00" + bytes(range(30)) for _ in range(10))
    body = bytearray(zlib.compress(raw))
    body[2:6] = b"\xff\xff\xff\xff"
    chunk = b"IDAT" + bytes(body)
    ihdr = b"IHDR" + (10).to_bytes(4, "big") + (10).to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])

    def framed(c: bytes) -> bytes:
        return (len(c) - 4).to_bytes(4, "big") + c + zlib.crc32(c).to_bytes(4, "big")

    end = framed(b"IEND")
    return b"\x89PNG\r\n\x1a\n" + framed(ihdr) + framed(chunk) + end


def _broken() -> list[tuple[str, bytes, str]]:
    png, jpeg = digiface_variants()[0], celeba_variants()[2]
    progressive = celeba_variants()[5]
    return [
        ("truncated PNG", png[: len(png) // 2], DIGIFACE),
        ("PNG cut in its header", png[:20], DIGIFACE),
        ("PNG with a bad checksum", _png_with_bad_checksum(), DIGIFACE),
        ("PNG with damaged pixels", _png_with_damaged_pixels(), DIGIFACE),
        ("truncated JPEG", jpeg[: len(jpeg) // 2], CELEBA),
        ("truncated progressive JPEG", progressive[: len(progressive) // 2], CELEBA),
        ("JPEG with its middle zeroed", jpeg[:600] + bytes(400) + jpeg[1000:], CELEBA),
        ("JPEG header only", jpeg[:2], CELEBA),
        ("not an image", b"hello, world", CELEBA),
    ]


@pytest.mark.parametrize(("what", "data", "source"), _broken(), ids=[b[0] for b in _broken()])
def test_broken_files_end_as_with_pil(what, data, source):
    assert _outcome(_fast, data, source) == _outcome(_pil, data, source), what


def test_an_empty_file_is_refused_naming_it():
    with pytest.raises(BadImage, match="empty.png: cannot decode this image"):
        fast_codecs.decode_rgb(b"", DIGIFACE, "empty.png")


@pytest.mark.parametrize(("source", "index"), [(CELEBA, 6), (DIGIFACE, 9)])
def test_max_pixels_refuses_before_decoding_as_pil_does(source, index):
    data = (celeba_variants() if source == CELEBA else digiface_variants())[index]
    set_max_pixels(100)
    try:
        outcome = _outcome(_fast, data, source)
        assert outcome == _outcome(_pil, data, source)
        assert outcome[0] == "error" and "data.max_pixels=100" in str(outcome[1])
    finally:
        set_max_pixels(DataConfig.max_pixels)


def test_a_missing_library_is_refused_with_its_install_command(monkeypatch):
    monkeypatch.setattr(decoders.Requirement, "available", lambda self: self.package != "pyspng")
    with pytest.raises(ConfigError, match=r"loader.decoder=fast needs pyspng.*\.\[fast\]"):
        decoders.require("fast")
    decoders.require("pil")  # the others need nothing more


def test_fallbacks_cross_worker_processes_with_their_batches(make_cfg, tmp_path):
    root = variants_tree(tmp_path / "variants")
    cfg = make_cfg(
        "data=celeba_digiface",
        f"data.root={root}",
        "loader=dataset",
        "loader.decoder=fast",
        "n_workers=2",
        "batch_size=3",
    )
    spec, ctx = prepared(cfg, root)
    stages.begin_epoch(True)
    batches = list(spec.build(ctx))
    delivered = sum(len(batch.ids) for batch in batches)
    ids = {int(i) for batch in batches for i in batch.ids}
    n_celeba = len(celeba_variants())
    expected = CELEBA_FALLBACKS | {n_celeba + i for i in DIGIFACE_FALLBACKS}
    assert sum(batch.stages.fallbacks for batch in batches) == len(expected & ids)
    assert delivered == len(ids) == (len(celeba_variants()) + len(digiface_variants())) // 3 * 3


def test_fallbacks_reach_the_metrics_and_the_log_line():
    totals = stages.StageTotals()
    totals.add_batch(stages.StageTimes((1, 2, 0, 3, 4), (1, 1, 0, 1, 1), 10, (1, 1), 2))
    totals.add_batch(stages.StageTimes((10, 20, 0, 30, 40), (5, 5, 0, 5, 5), 20, (1, 2), 1))
    totals.main_s["wait"] = 1.0
    metrics = totals.metrics(images=10, epoch_time_s=1.0)
    assert metrics["decode_fallbacks"] == 3
    assert "3 images decoded by PIL instead" in stages.describe(metrics)
    totals = stages.StageTotals()
    totals.add_batch(stages.StageTimes((1, 2, 0, 3, 4), (1, 1, 0, 1, 1), 10, (1, 1)))
    totals.main_s["wait"] = 1.0
    metrics = totals.metrics(images=10, epoch_time_s=1.0)
    assert metrics["decode_fallbacks"] == 0
    assert "decoded by PIL" not in stages.describe(metrics)
