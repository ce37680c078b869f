"""train.py, with /dev/shm filled by "another process" right after facebench checked it: for
tests. `python tests/fill_shm.py <train.py overrides>`, in a private mount namespace.

The check passes on the empty /dev/shm; then a file takes all but 1 MiB of it, as another
container's or job's files would, and the run's workers find no room for their first batch.
"""

from __future__ import annotations

import os
import runpy
import sys

from facebench.host import shared_memory
from facebench.host.paths import PROJECT_ROOT

FILLER = shared_memory.SHM / "facebench-test-filler"
_check = shared_memory.check


def check_then_fill(*args, **kwargs) -> None:
    _check(*args, **kwargs)
    room = shared_memory.space()
    with open(FILLER, "wb") as file:
        os.posix_fallocate(file.fileno(), 0, room.free - shared_memory.MIB)


shared_memory.check = check_then_fill
sys.argv = [str(PROJECT_ROOT / "train.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
