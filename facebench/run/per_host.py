"""Several emulated accelerators on one host: the job started again as that many ranks, one
process each, by torchrun's launcher (torch.distributed.run, its elastic agent), on this host.

    python train.py accelerator=h100 accelerators_per_host=4 loader=raw n_workers=2

Each rank has its own loader with its own n_workers and takes its share of every epoch (the
epoch plan's rank split, as under any torchrun job); the ranks meet after each emulated step, as
data-parallel training's all-reduce makes them. Rank 0 records the job (MLflow, results.json in
this job's folder): AU averaged over the ranks (DLIO's figure) and the lowest, images/s summed.
The job in Hydra's process only starts the ranks and reads back what rank 0 wrote, so a sweep
over accelerators_per_host is an ordinary sweep.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from facebench.config import TrainConfig
from facebench.errors import ConfigError, FacebenchError, TrackingLost
from facebench.host import parent_death
from facebench.host.children import spawn
from facebench.host.distributed import AGENT_PID_ENV, world_from_env
from facebench.host.paths import cache_dir
from facebench.host.resources import usable_cores
from facebench.results import RESULTS, TRACKING_LOST, JobResults
from facebench.run.accelerator import Accelerator
from facebench.run.entry import MULTIRUN_ENV, SWEEP_ID_ENV
from facebench.storage.distance import RELAY_ENV, emulated
from facebench.tracking.tracker import UPLOAD_COMMAND

log = logging.getLogger(__name__)

# How long torchrun's launcher has to stop its ranks when this job is stopped (it gives each
# rank 30 s by default; an emulated rank stops within a second or two).
STOP_GRACE_S = 20.0

# The job's pid, for its launcher: the process whose end stops the launcher (and so the ranks).
JOB_PID_ENV = "FACEBENCH_JOB_PID"


def wanted(cfg: TrainConfig) -> bool:
    """Whether this process should start the ranks (rather than be one): several accelerators
    asked for, and no torchrun around it yet. Refuses a torchrun of another size."""
    world = world_from_env()
    asked = cfg.accelerators_per_host
    if world.distributed and asked > 1 and world.local_world_size != asked:
        raise ConfigError(
            f"accelerators_per_host={asked}, but torchrun started {world.local_world_size} "
            "ranks on this host: start train.py alone (it starts the ranks), or give the same "
            "number to both"
        )
    return asked > 1 and not world.distributed


def run_ranks(
    cfg: TrainConfig, output_dir: Path | None, sweep_id: str | None, multirun: bool
) -> dict[str, float]:
    """This job, as cfg.accelerators_per_host ranks on this host; the metrics rank 0 recorded."""
    if output_dir is None:
        raise ConfigError("accelerators_per_host needs the job's output folder (train.py's)")
    # The config's own refusals (accelerator=custom without a rate) here, once, not in N ranks.
    Accelerator.of(cfg.accelerator, cfg.transform.crop, cfg.batch_size)
    ranks = cfg.accelerators_per_host
    command = [
        sys.executable,
        "-m",
        __name__,  # torchrun's launcher, run by _launcher below
        "--standalone",
        f"--nproc_per_node={ranks}",
        sys.argv[0],
        *HydraConfig.get().overrides.task,
        # Quoted: a sweep's folder names hold '=' and ',' (hydra.job.override_dirname).
        f"hydra.run.dir='{output_dir}'",
    ]
    env = {
        **os.environ,
        SWEEP_ID_ENV: sweep_id or "",
        JOB_PID_ENV: str(os.getpid()),
        MULTIRUN_ENV: "1" if multirun else "",
        # torchrun gives each of several ranks one thread unless told; a job of one rank runs
        # with every core's. The cores shared out, so a sweep over the count compares like with
        # like (tensor work in the loop's process, thread-based loaders).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, usable_cores() // ranks))),
    }
    log.info("starting %d ranks on this host, one emulated accelerator each", ranks)
    # A bucket's emulated distance: one relay for the host, its limits shared by every rank.
    with emulated(cfg.storage, cache_dir(cfg.data.cache_dir), cfg.seed) as via:
        returncode = _launch(command, env | ({RELAY_ENV: via} if via else {}))
    path = output_dir / RESULTS
    if not path.is_file():
        raise FacebenchError(
            f"the {cfg.accelerators_per_host} ranks of this job ended (exit status "
            f"{returncode}) before rank 0 wrote {path}; their lines above say why"
        )
    results = JobResults.read(path)
    if results.tracking == TRACKING_LOST:
        raise TrackingLost(
            f"run {results.run_name} finished but is not in MLflow ({results.tracking_error}); "
            f"once MLflow answers: {UPLOAD_COMMAND} {output_dir}"
        )
    if results.status != "FINISHED" or returncode != 0:
        raise FacebenchError(
            f"run {results.run_name} {results.status.lower()} in its ranks (exit status "
            f"{returncode}); their lines above say why"
        )
    return results.metrics


def _launch(command: list[str], env: dict[str, str]) -> int:
    """torchrun's launcher, waited for; if this process is stopped (Ctrl-C, SIGTERM as an
    exception), the launcher is asked to stop first, so that it stops its ranks (started in
    sessions of their own, they would outlive a killed launcher), then killed if it will not.
    Killed outright itself, this process asks nothing: the launcher sees it gone (_launcher),
    and stops its ranks in order, rather than die with it at once."""
    launcher = spawn(command, env=env, dies_with_parent=False)
    try:
        return launcher.process.wait()
    except BaseException:
        launcher.end(STOP_GRACE_S)
        raise


def _launcher(argv: list[str]) -> None:
    """torchrun's launcher (torch.distributed.run), quiet when stopped: told to stop, it stops
    its ranks, which say so in a line each, then raises SignalException, whose traceback would
    follow the ranks' lines. Ends with the signal's usual exit status instead."""
    # The job's end, however it ends (SIGKILL: a batch system's hard kill, the OOM killer),
    # stops the launcher as the job's SIGTERM would: SIGTERM lets torch's agent stop its ranks
    # in order, where SIGKILL would leave each to notice it gone. The job passes its pid down,
    # so that one killed before this line is noticed too.
    job = os.environ.get(JOB_PID_ENV, "")
    parent = int(job) if job.isdigit() else os.getppid()
    parent_death.end_with(parent, "the job", signal.SIGTERM, STOP_GRACE_S)
    # For the ranks (facebench.host.distributed.agent_pid): whose end to watch.
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main

    try:
        main(argv)
    except SignalException as stopped:
        raise SystemExit(128 + int(stopped.sigval)) from None


if __name__ == "__main__":
    _launcher(sys.argv[1:])
