"""Shards written by someone else, manifest and all, cannot make facebench run code.

A manifest's sha256 proves that a shard is the one the manifest names, not that facebench wrote
either: anyone who can write to a shard folder can rewrite both. Each crafted set below holds a
payload that would create a folder when loaded by pickle; facebench must refuse the set in one
line with the folder never made.
"""

from __future__ import annotations

import copyreg
import os
import pickle
from pathlib import Path

import pytest
from PIL import Image

from facebench.errors import ShardError
from facebench.run.entry import user_message
from facebench.run.runner import run_training
from facebench.shards import pickle_format
from facebench.shards.manifest import Manifest
from facebench.shards.pickle_format import UnsafeShard
from tests.helpers import replace_shard


class MakeFolder:
    """Unpickled, it creates the folder at `path`: proof that code named in a file ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.makedirs, (str(self.path), 0o777, True))  # exist_ok: it may run many times


@pytest.mark.parametrize("n_workers", [0, 2])
def test_a_pickle_shard_that_names_a_callable_is_refused_before_it_runs(
    make_cfg, tmp_path, n_workers
):
    cfg = make_cfg(
        "loader=pickle", f"shards_dir={tmp_path}", "shard_size=40", f"n_workers={n_workers}"
    )
    run_training(cfg)  # builds the shards
    folder = tmp_path / "pickle"
    name = Manifest.read(folder).shards[0].name
    samples = pickle_format.decode((folder / name).read_bytes(), name)
    marker = tmp_path / "payload-ran"
    crafted = pickle.dumps([*samples[:-1], (MakeFolder(marker), 0, 0)])
    replace_shard(folder, name, crafted)

    with pytest.raises(UnsafeShard) as raised:
        run_training(cfg)
    message = user_message(raised.value)
    assert not marker.exists()
    assert message.startswith(f"{folder / name}: holds os.makedirs")
    assert "never writes into a pickle shard" in message and "\n" not in message


def shard_of(*samples) -> list:
    return [(Image.new("RGB", (4, 4)), 1, 2), *samples]


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_payload_is_refused_at_every_pickle_protocol(tmp_path, protocol):
    marker = tmp_path / "payload-ran"
    # The payload first: protocol 0 names PIL's image through copy_reg, itself refused.
    data = pickle.dumps([(MakeFolder(marker), 0, 0), *shard_of()], protocol=protocol)
    with pytest.raises(UnsafeShard, match="shard-0.pickle: holds os.makedirs"):
        pickle_format.decode(data, "shard-0.pickle")
    assert not marker.exists()


def test_a_payload_reached_through_copyregs_extension_codes_is_refused(tmp_path):
    """EXT opcodes name a callable by a number registered in copyreg, not by its name."""
    marker = tmp_path / "payload-ran"
    copyreg.add_extension("os", "makedirs", 0xF00)
    try:
        data = pickle.dumps(shard_of((MakeFolder(marker), 0, 0)), pickle.HIGHEST_PROTOCOL)
        assert b"makedirs" not in data  # the call is named by its code alone
        with pytest.raises(UnsafeShard, match="holds os.makedirs"):
            pickle_format.decode(data, "shard-0.pickle")
    finally:
        copyreg.remove_extension("os", "makedirs", 0xF00)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("payload", "what"),
    [
        ({"images": []}, "something other than a list of"),
        (shard_of((Image.new("RGB", (4, 4)), "1", 2)), "something other than a list of"),
        (shard_of(([1, 2], 1, 2)), "something other than a list of"),
    ],
)
def test_anything_but_a_list_of_samples_is_refused(payload, what):
    with pytest.raises(UnsafeShard, match=what):
        pickle_format.decode(pickle.dumps(payload), "shard-0.pickle")


def test_bytes_that_are_no_pickle_are_named():
    with pytest.raises(ShardError, match="shard-0.pickle: not a pickle shard facebench wrote"):
        pickle_format.decode(b"\x80\x05garbage", "shard-0.pickle")


def test_images_whose_metadata_pil_fills_with_its_own_objects_still_load(tmp_path):
    """PIL keeps file metadata in image.info, with objects of its plugins (an EXIF resolution
    is a TiffImagePlugin.IFDRational): the writer leaves it out, so the reader, which accepts
    nothing but the image class, reads back every image facebench wrote."""
    from facebench.data.records import Record
    from facebench.data.sources import CELEBA

    exif = Image.Exif()
    exif[0x0128] = 2  # ResolutionUnit: inches
    exif[0x011A] = exif[0x011B] = 300  # XResolution, YResolution
    path = tmp_path / "000001.jpg"
    Image.new("RGB", (178, 218), "grey").save(path, exif=exif)
    with Image.open(path) as opened:
        info = opened.info
    assert any(type(value).__module__.startswith("PIL") for value in info.get("dpi", ())), info

    data = pickle_format.encode([(7, Record(str(path), 3, CELEBA))], {})
    [(image, label, sample_id)] = pickle_format.decode(data, "shard-0.pickle")
    assert (image.size, image.mode, label, sample_id) == ((128, 128), "RGB", 3, 7)


# LitData: an index names the serializer of each field, and its `pickle` serializer unpickles.


def litdata_set_with_payload(folder: Path, marker: Path, n_items: int) -> None:
    """Replace a LitData set with one LitData itself wrote, whose images are pickled objects
    that run code when read, and make the manifest agree (index and chunks)."""
    from litdata.streaming.writer import BinaryWriter

    from facebench.shards.litdata_format import INDEX, entries

    for path in folder.glob("chunk-*.bin"):
        path.unlink()
    (folder / INDEX).unlink()
    writer = BinaryWriter(str(folder), chunk_bytes="64MB")
    for i in range(n_items):
        writer[i] = {"image": MakeFolder(marker), "id": i, "label": 0}
    writer.done()
    writer.merge()
    manifest = Manifest.read(folder)
    manifest.shards = entries(folder)
    manifest.write(folder)


@pytest.fixture
def crafted_litdata_set(make_cfg, tmp_path) -> tuple:
    pytest.importorskip("litdata")
    cfg = make_cfg("loader=litdata", f"shards_dir={tmp_path}")
    run_training(cfg)  # builds the set
    marker = tmp_path / "payload-ran"
    litdata_set_with_payload(tmp_path / "litdata", marker, n_items=120)
    return cfg, tmp_path / "litdata", marker


def test_a_litdata_set_whose_index_names_pickle_is_refused(crafted_litdata_set):
    cfg, folder, marker = crafted_litdata_set
    with pytest.raises(ShardError) as raised:
        run_training(cfg)
    message = user_message(raised.value)
    assert message.startswith(f"{folder / 'index.json'}: names LitData serializer(s) pickle")
    assert "refused before LitData read it" in message and "\n" not in message
    assert not marker.exists()

    # The set is live: LitData left to itself runs the payload.
    from litdata import StreamingDataset

    next(iter(StreamingDataset(str(folder), cache_dir=str(folder.parent / "plain-cache"))))
    assert marker.is_dir()


def test_litdata_gets_no_serializer_that_unpickles(crafted_litdata_set):
    """Past the index check (an index changed after it, say), LitData still has no pickle."""
    from litdata import StreamingDataset

    from facebench.shards.litdata_format import serializers

    _, folder, marker = crafted_litdata_set
    with pytest.raises(ShardError, match="its 'pickle' serializer .* refused"):
        dataset = StreamingDataset(
            str(folder), cache_dir=str(folder.parent / "cache"), serializers=serializers()
        )
        next(iter(dataset))
    assert not marker.exists()
