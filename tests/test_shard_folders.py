"""A shard folder is shared with the user: builds delete only their own files, and a build that
was killed never blocks the next one."""

from __future__ import annotations

import importlib
import logging
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from facebench.errors import ShardError
from facebench.shards import formats, owned
from facebench.shards.build import ensure_shards
from facebench.shards.manifest import MANIFEST, Manifest

FORMATS = formats.names()
STALLED = Path(__file__).with_name("stalled_build.py")
# What a user may keep beside the shards: plain notes, a folder, and names like facebench's.
USER_FILES = {
    "notes.txt": "my notes",
    "subdir/keep.txt": "keep me",
    "shard-list.txt": "a list of my own",
    "shard-00000-backup.npy": "not a shard",
    ".hidden": "a dot file",
    "index.json.bak": "{}",
    "data/mine.txt": "in a folder Lance writes into: it stays, and so does its folder",
}


def _put_user_files(folder: Path) -> None:
    for name, text in USER_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def _assert_user_files_intact(folder: Path) -> None:
    for name, text in USER_FILES.items():
        assert (folder / name).read_text() == text, f"{name} was changed or removed"


def _assert_only_the_set_and_user_files(folder: Path) -> None:
    """Nothing of an older set or of an unfinished build is left beside the new set."""
    manifest = Manifest.read(folder)
    assert manifest is not None
    ours = {name.split("/")[0] for name in owned.manifest_files(folder)} | {MANIFEST, ".lock"}
    users = {name.split("/")[0] for name in USER_FILES}
    assert {path.name for path in folder.iterdir()} == ours | users


def _fail_after(monkeypatch, shard_format: str, n: int) -> None:
    """Make the next build of this format stop after n shards (n samples for a format written
    whole, as litdata and lance are), as a Ctrl-C would stop it."""
    module = importlib.import_module(f"facebench.shards.{shard_format}_format")
    if module.FORMAT.whole_set:
        write_set = _interrupted_write_set(module.FORMAT.write_set, n)
        monkeypatch.setattr(module, "FORMAT", replace(module.FORMAT, write_set=write_set))
        return
    original = module.FORMAT.encode
    calls = {"n": 0}

    def encode(samples, settings):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt
        return original(samples, settings)

    monkeypatch.setattr(module, "FORMAT", replace(module.FORMAT, encode=encode))


def _interrupted_write_set(write_set, n: int):
    """A format written whole: its library writes part of the set into the staging folder,
    then is stopped."""

    def interrupted(samples, folder, n_procs, cache, settings):
        write_set(samples[:n], folder, n_procs, cache, settings)
        raise KeyboardInterrupt

    return interrupted


@pytest.mark.parametrize("shard_format", FORMATS)
def test_user_files_survive_a_build_a_rebuild_and_a_resumed_build(
    data_copy, tmp_path, monkeypatch, shard_format
):
    folder = tmp_path / "shards" / shard_format
    folder.mkdir(parents=True)
    _put_user_files(folder)

    ensure_shards(data_copy, folder, shard_format, seed=0, shard_size=30)
    _assert_user_files_intact(folder)
    _assert_only_the_set_and_user_files(folder)

    rebuilt = ensure_shards(data_copy, folder, shard_format, seed=1, shard_size=50)
    assert rebuilt.built
    _assert_user_files_intact(folder)
    _assert_only_the_set_and_user_files(folder)

    with monkeypatch.context() as patched:
        _fail_after(patched, shard_format, 1)
        with pytest.raises(KeyboardInterrupt):
            ensure_shards(data_copy, folder, shard_format, seed=2, shard_size=40)
    assert Manifest.read(folder) is None  # an unfinished set never looks complete
    _assert_user_files_intact(folder)
    resumed = ensure_shards(data_copy, folder, shard_format, seed=2, shard_size=40)
    assert resumed.built and resumed.manifest.n_samples == 120
    _assert_user_files_intact(folder)
    _assert_only_the_set_and_user_files(folder)


@pytest.mark.parametrize(
    ("shard_format", "clash"),
    [
        ("pickle", "shard-00000.pickle"),
        ("raw", "shard-00001.npy.index.npy"),
        ("litdata", "index.json"),
        ("lance", "_versions"),
    ],
)
def test_a_user_file_in_the_way_is_named_and_left_alone(data_copy, tmp_path, shard_format, clash):
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / clash).write_text("mine")
    with pytest.raises(ShardError) as raised:
        ensure_shards(data_copy, folder, shard_format, shard_size=50)
    message = str(raised.value)
    assert str(folder / clash) in message and "not written by facebench" in message
    assert "shards_dir=" in message
    assert (folder / clash).read_text() == "mine"


def test_a_foreign_manifest_is_named_not_deleted(data_copy, tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"my": "manifest"}')
    with pytest.raises(ShardError, match="not a facebench manifest.*shards_dir="):
        ensure_shards(data_copy, folder, "raw", shard_size=50)
    assert (folder / "manifest.json").read_text() == '{"my": "manifest"}'


def _stalled(entry: str, cache: Path, shards: Path, out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(STALLED),
            entry,
            "2",
            f"data.cache_dir={cache}",
            "data.n_images=120",
            f"shards_dir={shards}",
            "shard_size=10",
            "n_workers=2",
            f"hydra.run.dir={out}",
            *overrides,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=out.parent,
    )


def _kill_mid_build(process: subprocess.Popen, folder: Path) -> list[psutil.Process]:
    """SIGKILL the builder once its workers are busy; the processes it had forked."""
    deadline = time.monotonic() + 120
    me = psutil.Process(process.pid)
    while True:
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the build never started"
        started = (folder / owned.PLAN).is_file()
        children = me.children(recursive=True)
        if started and (children or psutil.cpu_count() == 1):
            time.sleep(0.5)  # every worker reaches its stall
            children = me.children(recursive=True)
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    return children


@pytest.mark.slow
# Every format, killed through prepare.py and through train.py's own build in turn: the lock,
# the kill and the take-over are the same code for every format and entry point.
@pytest.mark.parametrize(
    ("shard_format", "loader", "entries"),
    [
        ("pickle", "pickle", ("prepare", "train")),
        ("raw", "raw", ("train",)),
        ("tar", "webdataset", ("prepare",)),
        ("litdata", "litdata", ("train",)),
    ],
)
def test_a_killed_build_never_blocks_the_next(
    tmp_path, cache, synthetic_root, prepare_here, shard_format, loader, entries
):
    shards = tmp_path / "shards"
    folder = shards / shard_format
    folder.mkdir(parents=True)
    _put_user_files(folder)
    overrides = {
        "prepare": [f"format={shard_format}"],
        "train": [f"loader={loader}", "model=none", "tracking=false", "batch_size=8"],
    }
    for entry in entries:
        process = _stalled(entry, cache, shards, tmp_path / entry, *overrides[entry])
        orphans = _kill_mid_build(process, folder)
        # Its workers go with it (before, they lived on, holding the lock and writing shards).
        gone, alive = psutil.wait_procs(orphans, timeout=10)
        for orphan in alive:
            orphan.kill()  # not to leave them to the rest of the suite
        assert not alive, f"{entry}.py's workers outlived it: {[p.pid for p in alive]}"
        assert Manifest.read(folder) is None
    # The next build, in this process (only the killed ones need processes of their own).
    output = prepare_here(
        f"shards_dir={shards}", "shard_size=10", "n_workers=2", f"format={shard_format}"
    )
    assert "waiting for" not in output
    assert "without finishing" in output and "taking over" in output
    assert Manifest.read(folder).n_samples == 120
    _assert_user_files_intact(folder)
    _assert_only_the_set_and_user_files(folder)


def test_a_lock_left_by_a_dead_builder_is_taken_over_with_a_notice(data_copy, tmp_path, caplog):
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / ".lock").write_text("999999999\n")  # a builder that never got to finish
    with caplog.at_level(logging.WARNING):
        shard_set = ensure_shards(data_copy, folder, "raw", shard_size=50)
    assert shard_set.built
    assert "process 999999999 stopped building shards" in caplog.text
    assert (folder / ".lock").read_text() == ""  # this build finished: nothing to take over
