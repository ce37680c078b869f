"""Disk room for a shard set that is not written yet: its folder's filesystem is read where the
folder will be, at its nearest existing ancestor."""

from __future__ import annotations

import os
import shutil

import pytest

from facebench.errors import ShardError
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
