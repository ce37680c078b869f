"""train.py or prepare.py whose shard writers stall, for tests that kill a build half way:

    python tests/stalled_build.py train|prepare N OVERRIDE...

Each process that writes shards (the builder itself, or each of its worker processes) writes N
shards (N samples for litdata, whose library writes one sample at a time) and then waits
forever, so a test can kill the build at a point it knows, with workers still busy.
"""

from __future__ import annotations

import functools
import importlib
import runpy
import sys
import time
from dataclasses import replace

from facebench.host.paths import PROJECT_ROOT
from facebench.shards import formats, litdata_format


def stall_after(function, n: int):
    calls = 0

    @functools.wraps(function)
    def stalled(*args, **kwargs):
        nonlocal calls
        calls += 1
        while calls > n:
            time.sleep(60)
        return function(*args, **kwargs)

    return stalled


if __name__ == "__main__":
    entry, n, *overrides = sys.argv[1:]
    for name in formats.names():
        module = importlib.import_module(f"facebench.shards.{name}_format")
        if module.FORMAT.encode is not None:
            module.FORMAT = replace(module.FORMAT, encode=stall_after(module.FORMAT.encode, int(n)))
    litdata_format.Items.__call__ = stall_after(litdata_format.Items.__call__, int(n))
    sys.argv = [f"{entry}.py", *overrides]
    runpy.run_path(str(PROJECT_ROOT / f"{entry}.py"), run_name="__main__")
