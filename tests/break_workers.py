"""Break running loaders' workers, for tests: `python tests/break_workers.py MODE CACHE LOADER...`.

MODE kill: SIGKILL one worker process after the first batch (loader=raydata's are Ray's, killed
by tests/test_raydata.py). MODE files: after the first batch, lower this process's open-file
limit to what it holds now, so that receiving the next batch fails. For each loader, prints the
one line the user would see and how long the epoch took to end.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import psutil
import torch
from hydra import compose, initialize_config_dir

from facebench import loaders
from facebench.config import typed
from facebench.data.listing import list_usable
from facebench.data.location import data_root
from facebench.errors import FacebenchError
from facebench.host.paths import PROJECT_ROOT
from facebench.run.entry import configure, install_process_handlers, user_message
from facebench.run.epoch import EpochSettings, run_epoch


def _no_room(root: str) -> int:
    """An open-file limit that leaves this process no room for another descriptor: the lowest
    descriptor number free now (a new file takes the lowest free number, and fails where that
    is at or above the limit; counting those held would leave room in any gap below), or lower
    where one is about to be freed (an image file a loader's thread is reading right now:
    closed, it would leave room for the next, and dali and spdl went on, now and then)."""
    held = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            held[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
    shards = os.path.join(root, "facebench-shards")
    in_flight = [
        fd
        for fd, target in held.items()
        if target.startswith(root) and not target.startswith(shards)
    ]
    lowest_free = min(set(range(len(held) + 1)) - set(held))
    return min([lowest_free, *in_flight])


def _workers(me: psutil.Process) -> list[psutil.Process]:
    """This process's loader workers. Forked ones share its command line (helpers such as
    multiprocessing's resource tracker do not); those started from multiprocessing's
    forkserver (loader=lance's) are the server's children."""
    found = [child for child in me.children() if child.cmdline() == me.cmdline()]
    for child in me.children():
        if "multiprocessing.forkserver" in " ".join(child.cmdline()):
            found += child.children()
    return found


def break_one(loader: str, mode: str, cache: str) -> None:
    overrides = [
        f"loader={loader}",
        f"data.cache_dir={cache}",
        "data.n_images=600",
        "device=cpu",
        "tracking=false",
        "model=none",
        "n_workers=2",
        "batch_size=4",
        "shard_size=50",
    ]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = typed(compose(config_name="train", overrides=overrides))
    root = data_root(cfg.data)
    module = loaders.get(loader)
    listing = list_usable(root, "raise", Path(cache))
    ctx = loaders.context(cfg, module, listing, torch.device("cpu"))
    module.set_up_job(ctx)
    me = psutil.Process()

    def build():
        # A previous loader's workers may still be on their way out: only this one's count.
        before = {child.pid for child in me.children(recursive=True)}
        batches = iter(module.build(ctx))
        first = next(batches)
        if mode == "kill":
            workers = [worker for worker in _workers(me) if worker.pid not in before]
            if not workers:
                print(f"{loader}: no worker processes to kill", flush=True)
                return
            workers[0].kill()
        else:
            resource.setrlimit(resource.RLIMIT_NOFILE, (_no_room(str(root)), limits[1]))
        yield first
        yield from batches

    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    started = time.perf_counter()
    try:
        with module.held(ctx):  # the loader's service for the job, as the runner holds it
            try:
                run_epoch(build, None, EpochSettings(torch.device("cpu"), loader_name=loader))
            finally:  # before the service stops: stopping Ray opens files
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        print(f"{loader}: no error", flush=True)
    except FacebenchError as error:
        print(f"{type(error).__name__}: {user_message(error)}", flush=True)
    print(f"{loader}: ended after {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    configure()
    install_process_handlers()  # as train.py's jobs do
    mode, cache, *names = sys.argv[1:]
    for name in names:
        break_one(name, mode, cache)
