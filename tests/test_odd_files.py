"""Files a user's folder can hold: names that are not UTF-8, images whose header declares more
pixels than memory holds. Every loader and every shard format: a correct run, or one line."""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from facebench.data.fast_decode import encoded_size
from facebench.errors import DataError, FacebenchError
from facebench.host.paths import PROJECT_ROOT
from facebench.run.entry import user_message
from facebench.run.runner import run_training
from facebench.shards.prepare import run_prepare
from tests.helpers import LOADERS

ODD = os.fsdecode(b"\xff\xfe")  # bytes that are not UTF-8, as the OS hands them to Python


@functools.cache  # a bomb takes a second to encode; every test writes the same bytes
def _jpeg(size=(40, 30), colour=(200, 30, 60), mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, colour if mode == "RGB" else 90).save(buffer, format="JPEG")
    return buffer.getvalue()


@functools.cache
def _png(size=(40, 30), mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, 1 if mode == "1" else (10, 120, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def _folder_tree(root: Path, per_class: int = 12) -> Path:
    """Two class folders, one of them named with odd bytes, with odd file names in both."""
    for klass in ("plain", f"odd {ODD}"):
        folder = root / klass
        (folder / f"deeper {ODD}").mkdir(parents=True)
        for index in range(per_class):
            name = f"img {index}{ODD if index % 3 == 0 else ''}"
            where = folder / f"deeper {ODD}" if index % 4 == 0 else folder
            if index % 2:
                (where / f"{name}.jpg").write_bytes(_jpeg(colour=(index * 9, 30, 60)))
            else:
                (where / f"{name}.png").write_bytes(_png())
    return root


def _cfg(make_cfg, root: Path, tmp_path: Path, *overrides: str):
    return make_cfg(
        "data=folder",
        f"data.root={root}",
        f"shards_dir={tmp_path / 'shards'}",
        "shard_size=7",
        "batch_size=4",
        "n_workers=2",
        *overrides,
    )


@pytest.mark.parametrize("loader", LOADERS)
def test_names_that_are_not_utf8_work_in_every_loader(make_cfg, tmp_path, loader):
    root = _folder_tree(tmp_path / "data")
    metrics = run_training(_cfg(make_cfg, root, tmp_path, f"loader={loader}"))
    # Every sample once (the run checks that), less at most a partial batch per worker.
    assert 24 - 2 * 3 <= metrics["samples_seen"] <= 24
    assert metrics["samples_unique"] == metrics["samples_seen"]


@pytest.mark.slow
def test_an_odd_name_skipped_or_failing_is_logged_as_one_readable_line(tmp_path, isolated_env):
    root = _folder_tree(tmp_path / "data")
    (root / "plain" / f"broken {ODD}.jpg").write_bytes(b"not a JPEG at all")
    common = [
        sys.executable,
        str(PROJECT_ROOT / "train.py"),
        "data=folder",
        f"data.root={root}",
        "model=none",
        "batch_size=4",
        "n_workers=2",
        "device=cpu",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    skipped = subprocess.run(
        [*common, "on_bad_sample=skip", f"hydra.run.dir={tmp_path / 'a'}"],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
    )
    output = skipped.stdout + skipped.stderr
    assert skipped.returncode == 0, output[-3000:]
    assert "skipping " in output and "broken \\xff\\xfe.jpg" in output
    assert "Logging error" not in output and "Traceback" not in output
    failed = subprocess.run(
        [*common, "on_bad_sample=raise", "loader=nodes", f"hydra.run.dir={tmp_path / 'b'}"],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
    )
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1
    [line] = [line for line in output.splitlines() if "broken \\xff\\xfe.jpg" in line]
    assert "cannot decode this image" in line
    assert "Logging error" not in output and "Traceback" not in output


def _bombs(root: Path) -> list[str]:
    """Two images whose headers declare more than 50 megapixels, in a few hundred KB."""
    folder = root / "plain"
    # One colour, one bit a pixel: 196 megapixels in a PNG of a few KB.
    (folder / "bomb.png").write_bytes(_png((14_000, 14_000), mode="1"))
    # A grey JPEG, 64 megapixels.
    (folder / f"bomb {ODD}.jpg").write_bytes(_jpeg((8_000, 8_000), mode="L"))
    return ["bomb.png", "bomb \\xff\\xfe.jpg"]


def test_a_header_gives_the_size_before_any_decoding():
    assert encoded_size(_png((14_000, 14_000), mode="1")) == (14_000, 14_000)
    assert encoded_size(_jpeg((300, 200))) == (300, 200)
    assert encoded_size(b"GIF89a....") is None


@pytest.mark.parametrize("loader", LOADERS)
def test_an_image_over_max_pixels_is_named_or_skipped_in_every_loader(make_cfg, tmp_path, loader):
    root = _folder_tree(tmp_path / "data", per_class=8)
    names = _bombs(root)
    with pytest.raises(FacebenchError) as raised:
        run_training(_cfg(make_cfg, root, tmp_path, f"loader={loader}"))
    line = user_message(raised.value)
    assert "\n" not in line and any(name in line for name in names), line
    assert "over data.max_pixels=50,000,000" in line and "megapixels" in line
    metrics = run_training(_cfg(make_cfg, root, tmp_path, f"loader={loader}", "on_bad_sample=skip"))
    assert metrics["samples_skipped"] == 2
    assert metrics["samples_seen"] <= 16


def test_prepare_refuses_an_image_over_max_pixels_in_one_line(make_cfg, tmp_path):
    root = _folder_tree(tmp_path / "data", per_class=4)
    _bombs(root)
    cfg = make_cfg(
        "data=folder", f"data.root={root}", f"shards_dir={tmp_path}", config_name="prepare"
    )
    with pytest.raises(DataError, match="megapixels.* is over data.max_pixels"):
        run_prepare(cfg)


def test_max_pixels_is_the_users_to_set(make_cfg, tmp_path):
    root = _folder_tree(tmp_path / "data", per_class=4)
    # Every image here is 40 x 30 = 1,200 pixels: a limit of 1,000 refuses them, 0 lifts it.
    with pytest.raises(
        DataError, match=r"40 x 30 pixels \(0.0 megapixels\) is over data.max_pixels=1,000"
    ):
        run_training(_cfg(make_cfg, root, tmp_path, "data.max_pixels=1000", "n_workers=0"))
    metrics = run_training(_cfg(make_cfg, root, tmp_path, "data.max_pixels=0", "n_workers=0"))
    assert metrics["samples_seen"] == 8
