"""Bad input gets a clear error or a counted skip, the same in every loader; nothing is lost."""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest
from PIL import Image

from facebench.errors import ConfigError, DataError, FacebenchError
from facebench.host import resources
from facebench.host.paths import PROJECT_ROOT
from facebench.measure.exactly_once import check_exactly_once
from facebench.run.runner import run_training
from tests.helpers import LOADERS


def _celeba(n: int) -> dict[str, int]:
    return {f"{i:06d}.jpg": 1 + i % 4 for i in range(1, n + 1)}


@pytest.fixture
def damaged_tree(tree_factory):
    """16 CelebA + 24 DigiFace images, of which 4 are bad in four different ways."""
    root = tree_factory(celeba=_celeba(16), digiface={0: 12, 1: 12})
    images = root / "CelebA" / "img_align_celeba"
    (images / "000002.jpg").unlink()  # named in the labels, absent
    (images / "000003.jpg").write_bytes(b"")  # zero bytes
    data = (images / "000004.jpg").read_bytes()
    (images / "000004.jpg").write_bytes(data[: len(data) // 3])  # truncated JPEG
    (root / "DigiFace1M" / "1" / "5.png").write_text("not a PNG at all")  # text named .png
    (root / "DigiFace1M" / "1" / "readme.txt").write_text("ignored by every loader")
    # PNGs outside <identity>/<n>.png: no loader takes them (the datapipe's FileLister would).
    shutil.copy(root / "DigiFace1M" / "0" / "0.png", root / "DigiFace1M" / "stray.png")
    (root / "DigiFace1M" / "1" / "sub").mkdir()
    shutil.copy(root / "DigiFace1M" / "0" / "0.png", root / "DigiFace1M" / "1" / "sub" / "0.png")
    return root


def _cfg(make_cfg, root, *overrides):
    return make_cfg("data=celeba_digiface", f"data.root={root}", "shard_size=10", *overrides)


@pytest.mark.parametrize("loader", LOADERS)
def test_skip_leaves_the_same_bad_samples_out_of_every_loader(make_cfg, damaged_tree, loader):
    metrics = run_training(
        _cfg(
            make_cfg,
            damaged_tree,
            f"loader={loader}",
            "on_bad_sample=skip",
            "n_workers=2",
            "batch_size=4",
        )
    )
    assert metrics["samples_skipped"] == 4
    # 36 usable samples; the exactly-once check inside run_training passed.
    assert metrics["samples_unique"] == metrics["samples_seen"]
    assert 36 - 2 * 3 <= metrics["samples_seen"] <= 36


def test_missing_and_empty_files_are_named_before_any_work(make_cfg, damaged_tree):
    with pytest.raises(DataError) as error:
        run_training(_cfg(make_cfg, damaged_tree))
    message = str(error.value)
    assert "000002.jpg: file not found (2 such files" in message
    assert "on_bad_sample=skip" in message


@pytest.mark.parametrize(("damage", "says"), [("truncated", "000004.jpg"), ("text", "1/5.png")])
@pytest.mark.parametrize("loader", [x for x in LOADERS if x != "raw"])
def test_undecodable_files_are_named_even_from_workers(
    make_cfg, tree_factory, damage, says, loader
):
    root = tree_factory(celeba=_celeba(8), digiface={0: 4, 1: 8})
    if damage == "truncated":
        path = root / "CelebA" / "img_align_celeba" / "000004.jpg"
        path.write_bytes(path.read_bytes()[:600])
    else:
        (root / "DigiFace1M" / "1" / "5.png").write_text("not a PNG at all")
    with pytest.raises(FacebenchError) as error:
        run_training(_cfg(make_cfg, root, f"loader={loader}", "n_workers=2", "batch_size=4"))
    assert says in str(error.value) and "cannot decode this image" in str(error.value)


@pytest.mark.slow
def test_worker_errors_reach_the_user_as_one_line(tmp_path, tree_factory, isolated_env):
    root = tree_factory(celeba=_celeba(8), digiface={0: 8})
    path = root / "CelebA" / "img_align_celeba" / "000004.jpg"
    path.write_bytes(path.read_bytes()[:600])
    result = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "train.py"),
            "data=celeba_digiface",
            f"data.root={root}",
            "model=none",
            "n_workers=2",
            "batch_size=4",
            "tracking=false",
            "device=cpu",
            f"hydra.run.dir={tmp_path / 'out'}",
        ],
        capture_output=True,
        text=True,
        env=isolated_env,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "000004.jpg: cannot decode this image" in output
    assert "Traceback" not in output


def _save(path, mode, size, fmt):
    buffer = io.BytesIO()
    Image.new(mode, size, 7).save(buffer, format=fmt)
    path.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("loader", LOADERS)
def test_grey_palette_and_rgb_images_are_converted(make_cfg, tree_factory, loader):
    root = tree_factory(celeba=_celeba(4), digiface={0: 4})
    images = root / "CelebA" / "img_align_celeba"
    _save(images / "000001.jpg", "L", (178, 218), "JPEG")
    _save(images / "000002.jpg", "P", (178, 218), "PNG")  # a palette image, named .jpg
    _save(root / "DigiFace1M" / "0" / "1.png", "RGB", (112, 112), "PNG")
    metrics = run_training(_cfg(make_cfg, root, f"loader={loader}", "batch_size=4"))
    assert metrics["samples_seen"] == 8, loader


def test_batch_larger_than_the_data_is_refused_up_front(make_cfg, tree_factory):
    root = tree_factory(celeba=_celeba(4), digiface={0: 4})
    with pytest.raises(ConfigError, match="batch_size=600 is larger than the 8 usable samples"):
        run_training(_cfg(make_cfg, root, "batch_size=600"))


def test_an_empty_dataset_is_an_error(tree_factory):
    from facebench.data.sources import read_records

    root = tree_factory(celeba={}, digiface={}, label_text="\n\n")
    with pytest.raises(DataError, match="no labelled images"):
        read_records(root)


@pytest.mark.parametrize("missing", ["CelebA", "DigiFace1M"])
def test_a_missing_source_folder_is_named(tree_factory, missing):
    from facebench.data.sources import read_records

    root = tree_factory(celeba=_celeba(2), digiface={0: 2})
    shutil.rmtree(root / missing)
    with pytest.raises(DataError, match=f"{missing}: the .* folder not found"):
        read_records(root)


@pytest.mark.parametrize("loader", LOADERS)
def test_uneven_workers_and_shards_still_deliver_each_sample_once(make_cfg, loader):
    # 120 samples, 3 workers, shards of 25 (4 x 25 + 20), batches of 8: nothing divides evenly.
    metrics = run_training(
        make_cfg(
            f"loader={loader}",
            "n_workers=3",
            "shard_size=25",
            "batch_size=8",
            "shards_dir=${data.cache_dir}/uneven",
        )
    )
    assert metrics["samples_unique"] == metrics["samples_seen"] >= 120 - 3 * 7


def test_repeats_and_wrong_counts_fail_loudly(make_cfg):
    cfg = make_cfg("batch_size=8")
    from facebench import loaders

    dataset = loaders.get("dataset")
    check_exactly_once(cfg, dataset, 120, {"samples_seen": 120, "samples_unique": 120})
    with pytest.raises(FacebenchError, match="more than once"):
        check_exactly_once(cfg, dataset, 120, {"samples_seen": 120, "samples_unique": 112})
    with pytest.raises(FacebenchError, match="delivered 112 samples in an epoch, expected 120"):
        check_exactly_once(cfg, dataset, 120, {"samples_seen": 112, "samples_unique": 112})


def test_workers_that_cannot_fit_are_refused_before_any_fork(make_cfg):
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(ConfigError) as raised:
        run_training(make_cfg("n_workers=100000", "batch_size=100"))
    message = str(raised.value)
    assert "n_workers=100000: 100000 workers of loader=dataset need about" in message
    assert "GiB are available" in message and "resource_check=false" in message
    started = {child.pid for child in psutil.Process().children()} - before
    assert started == set()  # refused before forking a single worker


def test_the_resource_check_can_be_overridden(make_cfg, monkeypatch, caplog):
    tight = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(available=100 * 2**20))
    monkeypatch.setattr(resources, "psutil", tight)
    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    cfg = make_cfg("n_workers=3", "batch_size=8")
    with pytest.raises(ConfigError, match="n_workers=3: 3 workers .* Use n_workers=1 or fewer"):
        run_training(cfg)
    with caplog.at_level(logging.WARNING):
        metrics = run_training(make_cfg("n_workers=3", "batch_size=8", "resource_check=false"))
    assert metrics["samples_seen"] == 120
    assert "n_workers=3: 3 workers on 2 cores share them" in caplog.text
