"""Parquet and Lance: what prepare.py writes, both of loader=parquet's modes, and each bad input
named in one line (the contract every loader keeps is tested for both in test_loaders.py and the
other per-loader files; reading from a bucket, in test_storage.py)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from facebench.errors import FacebenchError, ShardError
from facebench.run.entry import user_message
from facebench.run.runner import run_training
from facebench.shards.build import ensure_shards
from facebench.shards.lance_format import FOLDERS
from facebench.shards.manifest import Manifest, ShardEntry, file_sha256
from tests.helpers import (
    TOLERANCE,
    assert_same_samples,
    delivered,
    expected,
    prepared,
    replace_shard,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet_bytes(table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=10)
    return sink.getvalue().to_pybytes()


def test_parquet_files_hold_each_sample_once_in_row_groups_of_the_set_size(
    synthetic_root, tmp_path
):
    folder = tmp_path / "parquet"
    built = ensure_shards(synthetic_root, folder, "parquet", shard_size=50, row_group_size=20)
    ids = []
    for shard in built.manifest.shards:
        found = pq.ParquetFile(folder / shard.name)
        groups = [found.metadata.row_group(i).num_rows for i in range(found.num_row_groups)]
        assert groups[:-1] == [20] * (len(groups) - 1) and 0 < groups[-1] <= 20
        table = found.read()
        assert table.column_names == ["id", "label", "source", "path", "image"]
        first = Path(table.column("path")[0].as_py().decode())
        assert table.column("image")[0].as_py() == first.read_bytes()  # the file, as it is
        ids += table.column("id").to_pylist()
    assert sorted(ids) == list(range(120))
    # The row group size is one of the set's settings: another one rebuilds it.
    again = ensure_shards(synthetic_root, folder, "parquet", shard_size=50, row_group_size=20)
    assert not again.built
    assert ensure_shards(synthetic_root, folder, "parquet", shard_size=50, row_group_size=7).built


def test_a_lance_set_is_one_dataset_of_fragments_of_shard_size(synthetic_root, tmp_path):
    lance = pytest.importorskip("lance")
    folder = tmp_path / "lance"
    built = ensure_shards(synthetic_root, folder, "lance", shard_size=50)
    dataset = lance.dataset(str(folder))
    assert dataset.version == 1 and dataset.count_rows() == 120
    assert [fragment.count_rows() for fragment in dataset.get_fragments()] == [50, 50, 20]
    assert sorted(dataset.to_table(columns=["id"]).column("id").to_pylist()) == list(range(120))
    assert sum(entry.samples for entry in built.manifest.shards) == 120
    # Rebuilt with another fragment size, the older files are gone, not left beside the new.
    ensure_shards(synthetic_root, folder, "lance", shard_size=40)
    assert len(list((folder / "data").iterdir())) == 3
    assert lance.dataset(str(folder)).count_rows() == 120


@pytest.mark.parametrize("n_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_parquet_streaming_delivers_each_sample_once_with_the_same_pixels(
    make_cfg, synthetic_root, tmp_path, n_workers
):
    cfg = make_cfg(
        "loader=parquet",
        f"shards_dir={tmp_path}",  # cut for these workers: the shared set may be cut otherwise
        "loader.mode=streaming",
        "loader.shuffle_buffer=16",
        "loader.crop=center",
        f"n_workers={n_workers}",
    )
    spec, ctx = prepared(cfg, synthetic_root)
    seen = delivered(spec.build(ctx))
    assert len(seen) >= 120 - max(n_workers, 1) * 7  # a partial batch per worker may go
    assert_same_samples(seen, expected(synthetic_root), atol=TOLERANCE)


@pytest.fixture
def parquet_set(make_cfg, tmp_path) -> tuple:
    cfg = make_cfg("loader=parquet", f"shards_dir={tmp_path}", "shard_size=40")
    run_training(cfg)  # builds the shards
    folder = tmp_path / "parquet"
    return cfg, folder, Manifest.read(folder).shards[1].name


@pytest.mark.parametrize("mode", ["map", "streaming"])
def test_a_parquet_file_without_a_column_is_named(parquet_set, mode):
    cfg, folder, name = parquet_set
    table = pq.read_table(folder / name).drop_columns(["label"])
    replace_shard(folder, name, _parquet_bytes(table))
    with pytest.raises(ShardError) as raised:
        run_training(dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, mode=mode)))
    line = user_message(raised.value)
    assert line.startswith(f"{folder / name}: has no column label") and "\n" not in line
    assert "Rebuild: python prepare.py format=parquet" in line


@pytest.mark.slow
def test_a_truncated_parquet_file_is_rebuilt_or_named(parquet_set):
    cfg, folder, name = parquet_set
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    run_training(cfg)  # not the size its manifest records: the set is built again
    assert (folder / name).read_bytes() == data
    replace_shard(folder, name, data[: len(data) // 2])  # its manifest made to agree
    with pytest.raises(ShardError) as raised:
        run_training(cfg)
    line = user_message(raised.value)
    assert line.startswith(f"{folder / name}: not a readable Parquet file") and "\n" not in line


def test_a_row_that_is_not_an_image_is_named_and_the_run_ends_failed(
    parquet_set, tmp_path, empty_store, monkeypatch
):
    cfg, folder, name = parquet_set
    table = pq.read_table(folder / name)
    images = table.column("image").to_pylist()
    images[3] = b"these bytes are no image"
    table = table.set_column(4, "image", pa.array(images, pa.binary()))
    replace_shard(folder, name, _parquet_bytes(table))
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    path = table.column("path")[3].as_py().decode()
    with pytest.raises(FacebenchError) as raised:
        run_training(dataclasses.replace(cfg, tracking=True, n_workers=2))
    line = user_message(raised.value)
    assert line.startswith(f"{path} (row 3 of {name} of {folder}): cannot decode"), line
    runs = MlflowClient(store).search_runs(["1"])
    assert [run.info.status for run in runs] == ["FAILED"]  # nothing left RUNNING


@pytest.fixture
def lance_set(make_cfg, tmp_path) -> tuple:
    pytest.importorskip("lance")
    cfg = make_cfg("loader=lance", f"shards_dir={tmp_path}", "shard_size=40")
    run_training(cfg)  # builds the set
    return cfg, tmp_path / "lance"


def test_a_lance_set_changed_since_it_was_built_is_refused(lance_set):
    import lance

    cfg, folder = lance_set
    extra = lance.dataset(str(folder)).to_table().slice(0, 1)
    lance.write_dataset(extra, str(folder), mode="append")  # version 2, a fragment more
    with pytest.raises(ShardError) as raised:
        run_training(cfg)
    line = user_message(raised.value)
    assert line.startswith(f"{folder} (Lance dataset): version 2, not 1") and "\n" not in line
    assert "data file(s) its manifest does not name" in line
    assert "Rebuild: python prepare.py format=lance" in line


@pytest.mark.slow
def test_a_lance_dataset_of_another_schema_is_refused(lance_set):
    import lance

    cfg, folder = lance_set
    for name in FOLDERS:
        shutil.rmtree(folder / name)
    other = pa.table({"id": np.arange(120), "pixels": [b"x"] * 120})
    lance.write_dataset(other, str(folder), max_rows_per_file=40, data_storage_version="2.1")
    manifest = Manifest.read(folder)  # made to agree with the new files
    manifest.shards = [
        ShardEntry(p.relative_to(folder).as_posix(), 0, p.stat().st_size, file_sha256(p), "")
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.parts[len(folder.parts)] in FOLDERS
    ]
    manifest.write(folder)
    with pytest.raises(ShardError) as raised:
        run_training(cfg)
    line = user_message(raised.value)
    assert (
        line.startswith(f"{folder} (Lance dataset): columns ['id', 'pixels']") and "\n" not in line
    )


@pytest.mark.slow
@pytest.mark.parametrize("shard_format", ["parquet", "lance"])
def test_a_set_of_other_images_is_never_read(data_copy, tmp_path, make_cfg, shard_format):
    """A set built from other images (one more, here) is rebuilt before any read, as every
    format's is; a loader never reads the older one."""
    pytest.importorskip("lance" if shard_format == "lance" else "datasets")
    cfg = make_cfg(f"loader={shard_format}", f"shards_dir={tmp_path}", "shard_size=40")
    prepared(cfg, data_copy)
    image = next((data_copy / "DigiFace1M" / "0").iterdir())
    shutil.copy(image, image.with_name("999.png"))
    spec, ctx = prepared(cfg, data_copy)
    assert Manifest.read(ctx.shards_dir).n_samples == 121
    assert len(delivered(spec.build(ctx))) == 120  # 121 in batches of 8, as the others


@pytest.mark.slow
def test_an_arrow_copy_that_cannot_be_written_says_where_and_what_to_do(parquet_set, monkeypatch):
    import datasets
    from datasets.exceptions import DatasetGenerationError

    from facebench.loaders import parquet

    cfg, folder, _ = parquet_set

    def full(*args, **kwargs):
        try:
            raise OSError(28, "No space left on device")
        except OSError as error:
            raise DatasetGenerationError("An error occurred while generating") from error

    monkeypatch.setattr(datasets, "load_dataset", full)
    monkeypatch.setattr(parquet, "_copies", {})  # the copy the fixture's run made, forgotten
    with pytest.raises(ShardError) as raised:
        run_training(cfg)
    line = user_message(raised.value)
    assert line.startswith(f"{folder}: Hugging Face datasets could not read these Parquet files")
    assert "No space left on device" in line and "make room or set data.cache_dir" in line
