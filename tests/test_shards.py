"""prepare.py's shards: complete, verified, idempotent, and never unpickled unless vouched for."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from facebench.data.sources import read_records
from facebench.errors import ShardError
from facebench.loaders import pickle as pickle_loader
from facebench.run.entry import user_message
from facebench.run.runner import run_training
from facebench.shards import pickle_format
from facebench.shards.build import ensure_shards
from facebench.shards.manifest import MANIFEST, Manifest, read_verified
from facebench.shards.prepare import run_prepare
from tests.helpers import HOLD_LOCK


def test_shards_hold_every_sample_once_decoded_and_shuffled(data_copy, tmp_path):
    shard_set = ensure_shards(data_copy, tmp_path / "shards", "pickle", seed=3, shard_size=50)
    manifest = shard_set.manifest
    assert [s.samples for s in manifest.shards] == [50, 50, 20]  # no empty last shard
    assert manifest.n_samples == 120
    records, labels = read_records(data_copy)
    assert manifest.n_classes == labels.n_classes
    samples = []
    for shard in manifest.shards:
        data = (tmp_path / "shards" / shard.name).read_bytes()
        assert len(data) == shard.bytes
        assert hashlib.sha256(data).hexdigest() == shard.sha256
        samples += list(pickle_format.decode(data, shard.name))
    sizes = {image.size for image, _, _ in samples}
    assert sizes == {(128, 128), (112, 112)}  # CelebA cropped, DigiFace as is
    assert {image.mode for image, _, _ in samples} == {"RGB"}
    # Every sample once, with its own label, in a shuffled order.
    ids = [sample_id for _, _, sample_id in samples]
    assert sorted(ids) == list(range(120))
    assert all(label == records[i].label for _, label, i in samples)
    assert ids != sorted(ids)


def test_same_seed_same_shards_other_seed_other_order(data_copy, tmp_path):
    first = ensure_shards(data_copy, tmp_path / "a", "pickle", seed=1, shard_size=60).manifest
    again = ensure_shards(data_copy, tmp_path / "b", "pickle", seed=1, shard_size=60).manifest
    other = ensure_shards(data_copy, tmp_path / "c", "pickle", seed=2, shard_size=60).manifest
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in again.shards]
    assert [s.sha256 for s in first.shards] != [s.sha256 for s in other.shards]


@pytest.mark.parametrize("shard_format", ["pickle", "raw", "tar", "parquet", "lance"])
def test_rerun_with_unchanged_inputs_does_nothing(data_copy, tmp_path, caplog, shard_format):
    folder = tmp_path / "shards"
    first = ensure_shards(data_copy, folder, shard_format, shard_size=50)
    assert first.built
    assert sorted(s.samples for s in first.manifest.shards if s.samples) == [20, 50, 50]

    def stamps() -> dict[str, int]:
        # The lock file records who builds (for anyone waiting); the set itself must not change.
        return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != ".lock"}

    before = stamps()
    with caplog.at_level(logging.INFO):
        again = ensure_shards(data_copy, folder, shard_format, shard_size=50)
    assert not again.built
    assert "up to date" in caplog.text and "nothing to do" in caplog.text
    assert stamps() == before


def test_changed_settings_or_inputs_rebuild(data_copy, tmp_path):
    folder = tmp_path / "shards"
    ensure_shards(data_copy, folder, "pickle", shard_size=50)
    resized = ensure_shards(data_copy, folder, "pickle", shard_size=40)
    assert resized.built and len(resized.manifest.shards) == 3
    names = [f"shard-0000{i}.pickle" for i in range(3)]
    index = [f"{name}.index.npy" for name in names]
    assert sorted(p.name for p in folder.iterdir()) == sorted([".lock", MANIFEST, *names, *index])
    image = next((data_copy / "DigiFace1M" / "0").iterdir())
    shutil.copy(image, image.with_name("999.png"))
    grown = ensure_shards(data_copy, folder, "pickle", shard_size=40)
    assert grown.built and grown.manifest.n_samples == 121


def test_a_shard_that_does_not_match_is_never_unpickled(data_copy, tmp_path):
    folder = tmp_path / "shards"
    manifest = ensure_shards(data_copy, folder, "pickle", shard_size=200).manifest
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    (folder / manifest.shards[0].name).write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ShardError, match="does not match the manifest"):
        read_verified(folder / manifest.shards[0].name, manifest.shards[0].sha256)
    assert not marker.exists()


@pytest.mark.parametrize("n_workers", [0, 2])
def test_a_refused_shard_is_one_line_without_the_pipeline(make_cfg, tmp_path, n_workers):
    cfg = make_cfg(
        "loader=pickle", f"shards_dir={tmp_path}", "shard_size=40", f"n_workers={n_workers}"
    )
    run_training(cfg)  # builds the shards
    shard = sorted((tmp_path / "pickle").glob("shard-*.pickle"))[0]
    data = bytearray(shard.read_bytes())
    data[100:110] = b"0123456789"  # same size: only the hash can tell
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError) as raised:
        run_training(cfg)
    message = user_message(raised.value)
    assert f"{shard}: sha256" in message and "does not match the manifest" in message
    # torch's DataPipes append a repr of the whole pipeline, every shard's sha256 included.
    assert "thrown by __iter__" not in message and len(message) < 400


def test_loader_refuses_a_folder_without_manifest(make_cfg, data_copy, tmp_path):
    folder = tmp_path / "shards" / "pickle"
    ensure_shards(data_copy, folder, "pickle", shard_size=50)
    (folder / MANIFEST).unlink()  # as if prepare.py had been interrupted
    from tests.helpers import context

    cfg = make_cfg("loader=pickle", f"shards_dir={tmp_path / 'shards'}")
    with pytest.raises(ShardError, match="no complete shard set .*python prepare.py"):
        pickle_loader.build(context(cfg, data_copy))


@pytest.mark.parametrize(
    ("shard_format", "loader"), [("pickle", "pickle"), ("raw", "raw"), ("tar", "webdataset")]
)
def test_prepare_entry_point_writes_where_train_reads(make_cfg, tmp_path, shard_format, loader):
    cfg = make_cfg(
        f"shards_dir={tmp_path}", "shard_size=50", f"format={shard_format}", config_name="prepare"
    )
    shard_set = run_prepare(cfg, output_dir=tmp_path / "out")
    assert shard_set.folder == tmp_path / shard_format
    assert Manifest.read(shard_set.folder) is not None
    assert (tmp_path / "out" / "results.json").is_file()
    train_cfg = make_cfg(f"loader={loader}", f"shards_dir={tmp_path}", "shard_size=50")
    metrics = run_training(train_cfg)
    assert "prepare_s" not in metrics  # the shards were already there
    assert metrics["samples_seen"] == 120


def test_train_builds_missing_shards_outside_the_clock(make_cfg, tmp_path):
    cfg = make_cfg("loader=pickle", f"shards_dir={tmp_path}", "shard_size=40")
    metrics = run_training(cfg)
    assert metrics["prepare_s"] > 0
    assert metrics["samples_seen"] == 120
    assert np.isfinite(metrics["epoch_time_s"])


@pytest.mark.parametrize("loader", ["pickle", "webdataset"])
def test_shards_rebuilt_during_the_run_are_refused_in_one_line(
    make_cfg, synthetic_root, tmp_path, loader
):
    """prepare.py with another seed, while train.py reads the same shards: the reader says what
    happened, instead of a traceback for a deleted file or, worse, mixing two shard sets."""
    from facebench import loaders
    from facebench.loaders.shardsets import ShardsChanged
    from tests.helpers import context

    cfg = make_cfg(f"loader={loader}", f"shards_dir={tmp_path}", "shard_size=20", "batch_size=4")
    module = loaders.get(loader)
    ctx = context(cfg, synthetic_root)
    module.set_up_job(ctx)
    batches = iter(module.build(ctx))
    next(batches)
    ensure_shards(ctx.data_root, ctx.shards_dir, ctx.shards_dir.name, seed=1, shard_size=20)
    with pytest.raises(ShardsChanged, match="shards changed during the run") as raised:
        for _ in batches:
            pass
    assert "Traceback" not in str(raised.value) and "sha256" not in str(raised.value)


def test_a_build_that_waits_for_another_says_so(data_copy, tmp_path, caplog):
    folder = tmp_path / "shards"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.INFO):
            waiting = threading.Thread(
                target=ensure_shards, args=(data_copy, folder, "raw"), kwargs={"shard_size": 50}
            )
            waiting.start()
            deadline = time.monotonic() + 30
            while f"waiting for process {holder.pid}" not in caplog.text:
                assert time.monotonic() < deadline, "no word while waiting for the lock"
                time.sleep(0.05)
            assert str(folder) in caplog.text and waiting.is_alive()
            holder.stdin.close()  # the other build is done
            holder.wait(timeout=30)
            waiting.join(timeout=60)
    finally:
        holder.kill()
    assert not waiting.is_alive()
    assert Manifest.read(folder) is not None
    # It ended cleanly (its lock file says nobody builds): no takeover is announced.
    assert "taking over" not in caplog.text


def test_raw_reads_the_shards_it_opened_even_if_they_are_rebuilt(
    make_cfg, synthetic_root, tmp_path
):
    """raw opens its shard files when the epoch starts: a rebuild meanwhile (new files under the
    same names) changes nothing in that epoch, which sees every sample once with its label."""
    from facebench import loaders
    from tests.helpers import context, delivered

    cfg = make_cfg("loader=raw", f"shards_dir={tmp_path}", "shard_size=20", "batch_size=4")
    module = loaders.get("raw")
    ctx = context(cfg, synthetic_root)
    module.set_up_job(ctx)
    batches = iter(module.build(ctx))
    first = next(batches)
    ensure_shards(ctx.data_root, ctx.shards_dir, "raw", seed=1, shard_size=20)
    seen = delivered([first, *batches])
    assert sorted(seen) == list(range(120))
    assert all(label == ctx.records[i].label for i, (_, label) in seen.items())


@pytest.mark.parametrize(
    ("n_samples", "shard_size", "readers", "built", "batch", "expected"),
    [
        (6000, 10_000, 1, None, 600, 10_000),  # one reader: the configured size
        (6000, 10_000, 5, None, 600, 600),  # 1 shard for 5 workers: 10 of 600, for 10 too
        (6000, 10_000, 10, 1200, 600, 600),  # a set built for 5 alone is too coarse for 10
        (6000, 10_000, 5, 600, 600, 600),  # the set built for 10 serves 5: reused
        (6000, 500, 5, None, 600, 500),  # 12 shards already
        (6500, 10_000, 10, None, 600, 600),  # whole batches: 11 shards, the last of 500
        (2400, 10_000, 10, None, 1, 150),  # batch 1: an even cut, for 16 workers
        (20_000, 10_000, 2, None, 600, 10_000),  # the article's shard_size serves 2 workers
        (20_000, 10_000, 5, None, 600, 1200),  # 17 shards: 16 workers get one
        (12_000, 10_000, 20, None, 600, 600),  # more workers than 16: one shard each
    ],
)
def test_shard_size_gives_every_worker_a_shard(
    n_samples, shard_size, readers, built, batch, expected
):
    from facebench.shards.plan import shard_size_for, workers_without_a_batch

    assert workers_without_a_batch(n_samples, batch, readers) == 0
    size = shard_size_for(n_samples, shard_size, readers, built, batch)
    assert size == expected
    assert -(-n_samples // size) >= readers


def test_a_run_whose_data_cannot_give_every_worker_a_batch_is_refused(data_copy, tmp_path):
    from facebench.errors import ConfigError

    folder = tmp_path / "shards"
    with pytest.raises(ConfigError) as refused:
        ensure_shards(data_copy, folder, "tar", readers=5, batch_size=40)  # 120 samples: 3 batches
    message = str(refused.value)
    assert "120 samples make 3 batch(es) of 40, too few for 5 workers" in message
    assert "2 would have nothing to do" in message
    assert "n_workers=3" in message and "batch_size=24" in message
    # Refused before anything was written (the build's lock file aside).
    assert not list(folder.glob("shard-*")) and not (folder / MANIFEST).exists()


def test_a_run_builds_a_shard_for_each_worker_and_records_the_size(data_copy, tmp_path, caplog):
    folder = tmp_path / "shards"
    with caplog.at_level(logging.INFO):
        built = ensure_shards(data_copy, folder, "pickle", readers=4, batch_size=8)
    manifest = built.manifest
    # 120 samples, batch 8: 15 batches, cut for 15 workers (not only the 4 asked): shards of 8.
    assert [s.samples for s in manifest.shards] == [8] * 15
    assert manifest.settings["shard_size"] == 8
    assert "shards of 8 instead" in caplog.text
    # Fewer workers later: the finer set serves them as it is.
    again = ensure_shards(data_copy, folder, "pickle", readers=2, batch_size=8)
    assert not again.built and again.manifest.settings["shard_size"] == 8
    # raw's batches are gathered from every shard by threads: its shard_size stays as asked.
    raw = ensure_shards(data_copy, tmp_path / "raw", "raw", shard_size=10_000, readers=4).manifest
    assert len(raw.shards) == 1


def test_prepare_then_the_articles_sweep_builds_nothing(make_cfg, prepare_here, tmp_path, caplog):
    """The README's flow: python prepare.py, then loader=pickle at 5 and at 10 workers."""
    prepare_here("format=pickle", f"shards_dir={tmp_path}", "batch_size=8")
    for workers in (5, 10):
        caplog.clear()
        cfg = make_cfg("loader=pickle", f"shards_dir={tmp_path}", f"n_workers={workers}")
        with caplog.at_level(logging.INFO):
            metrics = run_training(cfg)
        assert "prepare_s" not in metrics, caplog.text  # nothing built
        assert "rebuilding" not in caplog.text and "shards up to date" in caplog.text
        assert metrics["samples_seen"] == 120  # 15 shards of one batch each: nothing dropped
