"""Every image PIL accepts gives the same sample, pixel for pixel, through every loader.

A tree of the unusual cases real folders hold: images smaller than CelebA's crop box (which PIL
pads with black), grey, CMYK, progressive and EXIF-rotated JPEGs, other formats under a .jpg name,
16-bit, palette-with-transparency, interlaced, grey-alpha PNGs, and sizes from 1x1 up. With a
center crop every loader must deliver each of them once, as loader=dataset's PIL path does.
"""

from __future__ import annotations

import pytest

from tests.helpers import assert_same_samples, delivered, expected, prepared
from tests.odd_images import variants_tree

# torchvision.io + tensor resampling round a little differently from PIL (4 grey levels).
TOLERANCE = 4 / 255 / 0.225
CASES = [
    ("dataset", ()),
    ("datapipe", ()),
    ("pickle", ()),
    ("raw", ()),
    ("webdataset", ("loader.decoder=torchvision",)),
    ("webdataset", ("loader.decoder=pil",)),
    ("nodes", ("loader.decoder=torchvision",)),
    ("nodes", ("loader.decoder=pil",)),
    ("nodes", ("loader.decoder=fast",)),
    ("dataset", ("loader.decoder=fast",)),
    ("spdl", ()),
    ("dali", ()),
    ("litdata", ()),
]


@pytest.fixture(scope="module")
def variants_root(tmp_path_factory):
    return variants_tree(tmp_path_factory.mktemp("variants"))


@pytest.mark.parametrize(("name", "options"), CASES, ids=lambda case: str(case))
def test_every_loader_gives_dataset_pixels_for_every_image_pil_accepts(
    make_cfg, variants_root, name, options
):
    cfg = make_cfg(
        "data=celeba_digiface",
        f"data.root={variants_root}",
        f"loader={name}",
        "loader.crop=center",
        "batch_size=1",
        "shard_size=8",
        *options,
    )
    module, ctx = prepared(cfg, variants_root)
    seen = delivered(module.build(ctx))
    truth = expected(variants_root)
    assert sorted(seen) == sorted(truth)
    assert_same_samples(seen, truth, atol=TOLERANCE)
