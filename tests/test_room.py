"""Disk room for a shard set that is not written yet: its folder's filesystem is read where the
folder will be, at its nearest existing ancestor."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from facebench.errors import DataError, ShardError
from facebench.host import paths
from facebench.shards import room


def test_a_folder_not_made_yet_is_measured_at_its_nearest_existing_ancestor(tmp_path):
    missing = tmp_path / "not" / "made" / "yet"
    assert room.block_size(missing) == (os.statvfs(tmp_path).f_frsize or 4096)
    # Free space moves as other work writes beside us: the same filesystem within 1 GB.
    assert abs(room.free_bytes(missing) - shutil.disk_usage(tmp_path).free) < 1e9
    assert not missing.parent.exists()  # measuring made nothing


def test_a_set_that_cannot_fit_is_refused_with_what_it_needs_and_what_is_free(tmp_path):
    free = room.free_bytes(tmp_path)
    with pytest.raises(ShardError, match="not enough disk space.*shards_dir="):
        room.check_room(tmp_path / "set", needed=free + 10**12, reusable=0)


def test_writability_is_asked_of_the_same_nearest_existing_folder(tmp_path, monkeypatch):
    """Shards not written yet: their room and whether they can be written are both read at the
    one nearest existing folder (host/paths.nearest_existing)."""
    missing = tmp_path / "not" / "made" / "yet"
    assert paths.nearest_existing(missing) == tmp_path
    assert paths.nearest_existing(tmp_path) == tmp_path
    asked = []

    def refused(path, mode):  # whoever runs the tests: root may write anywhere
        asked.append(path)
        return False

    monkeypatch.setattr(paths.os, "access", refused)
    with pytest.raises(DataError, match=re.escape(f"{missing}: cannot write shards here")):
        paths.check_writable(missing)
    assert asked == [tmp_path]
