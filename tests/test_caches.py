"""Every cache facebench keeps between runs, with its source changed under it: the next run reads
the source as it is now, never what the cache kept of it. (The bucket's copy: test_bucket_copy.py;
a Parquet set in a bucket: test_storage.py.)"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest
import torch

from facebench.data.listing import list_usable
from facebench.data.location import data_layout
from facebench.host.paths import cache_dir
from facebench.shards import copies
from facebench.shards.build import ensure_shards
from facebench.shards.manifest import Manifest
from tests.helpers import delivered, prepared, replace_shard

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("datasets")


def _two_rows(path: Path) -> tuple[int, int]:
    """Two rows of the file from the same source (whose images are cropped alike)."""
    sources = pq.read_table(path, columns=["source"]).column("source").to_pylist()
    return 0, sources.index(sources[0], 1)


def _swapped(path: Path) -> bytes:
    """The Parquet file with the images of two of its rows swapped: the same ids, labels and
    size, other pixels for two samples."""
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    one, two = _two_rows(path)
    images[one], images[two] = images[two], images[one]
    table = table.set_column(4, "image", pa.array(images, pa.binary()))
    sink = pa.BufferOutputStream()
    row_groups = pq.ParquetFile(path).metadata.row_group(0).num_rows
    pq.write_table(table, sink, row_group_size=row_groups)
    return sink.getvalue().to_pybytes()


def _swapped_ids(path: Path) -> list[int]:
    ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
    return [ids[row] for row in _two_rows(path)]


@pytest.mark.parametrize("mode", ["map", "streaming"])
def test_a_replaced_parquet_file_is_read_as_it_is_never_from_an_old_copy(
    make_cfg, synthetic_root, tmp_path, mode, monkeypatch
):
    """A set rebuilt with other images, its files' times kept (as `cp -p` or `rsync -a` keep
    them): datasets' own cache key (a local file's time) would serve the old copy."""
    from facebench.loaders import parquet

    cfg = make_cfg(
        "loader=parquet", f"loader.mode={mode}", f"shards_dir={tmp_path}", "shard_size=40",
        "loader.crop=center", f"data.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    spec, ctx = prepared(cfg, synthetic_root)
    before = delivered(spec.build(ctx))
    name = Manifest.read(ctx.shards_dir).shards[1].name
    path = ctx.shards_dir / name
    first, second = _swapped_ids(path)
    kept = path.stat()
    replace_shard(ctx.shards_dir, name, _swapped(path))
    os.utime(path, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    monkeypatch.setattr(parquet, "_copies", {})  # as a new process finds it: on disk alone
    spec, ctx = prepared(cfg, synthetic_root)
    after = delivered(spec.build(ctx))
    assert torch.equal(after[first][0], before[second][0])
    assert torch.equal(after[second][0], before[first][0])
    assert after[first][1] == before[first][1]  # labels stay the ids'


def test_an_arrow_copy_is_made_again_once_a_file_it_came_from_changed(
    make_cfg, synthetic_root, tmp_path, caplog
):
    """The manifest left as it was, a file written again (a new time, the same bytes here): the
    copy is no longer current, and is cleared for the library to make again, which says so."""
    cache = tmp_path / "cache"
    cfg = make_cfg(
        "loader=parquet", f"shards_dir={tmp_path}", "shard_size=40", f"data.cache_dir={cache}"
    )
    _, ctx = prepared(cfg, synthetic_root)
    manifest = Manifest.read(ctx.shards_dir)
    copy = copies.copy_for(cache / copies.ARROW_COPIES, ctx.shards_dir, manifest)
    assert copy.current() and any(copy.folder.rglob("*.arrow"))
    path = ctx.shards_dir / manifest.shards[1].name
    path.write_bytes(path.read_bytes())
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    copy = copies.copy_for(cache / copies.ARROW_COPIES, ctx.shards_dir, manifest)
    assert not copy.current()
    with caplog.at_level(logging.INFO, logger=copies.__name__):
        copy.renew()
    assert not copy.folder.exists()
    assert f"{path} changed since the Arrow copy in {copy.folder} was made" in caplog.text


def test_copies_of_a_rebuilt_set_are_removed_and_nothing_else(make_cfg, synthetic_root, tmp_path):
    cache = tmp_path / "cache"
    cfg = make_cfg(
        "loader=parquet", f"shards_dir={tmp_path}", "shard_size=40", f"data.cache_dir={cache}"
    )
    _, ctx = prepared(cfg, synthetic_root)
    copies_root = cache / copies.ARROW_COPIES
    made = [stamp.parent for stamp in copies_root.glob(f"*/{copies.MADE_FROM}")]
    assert len(made) == 1
    users = copies_root / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("not facebench's")
    other = dataclasses.replace(cfg, row_group_size=7)  # another set in the same folder
    _, ctx = prepared(other, synthetic_root)
    remade = [stamp.parent for stamp in copies_root.glob(f"*/{copies.MADE_FROM}")]
    assert len(remade) == 1 and remade[0] != made[0] and not made[0].exists()
    assert (users / "notes.txt").read_text() == "not facebench's"
    # Rebuilt again by prepare.py's path (shards/build.py): no copy of the old set is left.
    ensure_shards(synthetic_root, ctx.shards_dir, "parquet", shard_size=40, cache=cache)
    assert not remade[0].exists()


def test_the_checked_listing_follows_the_images_it_checked(make_cfg, data_copy):
    """The listing's decode check (data.cache_dir/checks) is keyed by the files' sizes and
    times: an image replaced with bytes that are no image is checked again and refused."""
    cfg = make_cfg("on_bad_sample=skip")
    cache = cache_dir(cfg.data.cache_dir)
    first = list_usable(data_copy, "skip", cache, 1, data_layout(cfg.data))
    assert not first.usable.skipped
    image = next((data_copy / "DigiFace1M" / "0").iterdir())
    image.write_bytes(b"no image at all")
    again = list_usable(data_copy, "skip", cache, 1, data_layout(cfg.data))
    assert [path for path, _ in again.usable.skipped] == [str(image)]


@pytest.mark.parametrize("shard_format", ["pickle", "raw"])
def test_decoded_shards_follow_an_image_replaced_under_them(data_copy, tmp_path, shard_format):
    """Decoded shards keep pixels, not files: an image replaced by another (same name, same
    count of images) has the set built again from the files as they are now."""
    folder = tmp_path / shard_format
    before = ensure_shards(data_copy, folder, shard_format, shard_size=40)
    images = sorted((data_copy / "DigiFace1M" / "0").iterdir())
    images[0].write_bytes(images[1].read_bytes())  # another face under the first one's name
    after = ensure_shards(data_copy, folder, shard_format, shard_size=40)
    assert after.built and after.manifest.n_samples == before.manifest.n_samples
    assert after.manifest.source_fingerprint != before.manifest.source_fingerprint
