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
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from facebench.config import TrainConfig
from facebench.distributed import world_from_env
from facebench.entry import MULTIRUN_ENV, SWEEP_ID_ENV
from facebench.errors import ConfigError, FacebenchError, TrackingLost
from facebench.results import RESULTS, TRACKING_LOST, JobResults
from facebench.tracking import UPLOAD_COMMAND

log = logging.getLogger(__name__)


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
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={cfg.accelerators_per_host}",
        sys.argv[0],
        *HydraConfig.get().overrides.task,
        f"hydra.run.dir={output_dir}",
    ]
    env = {**os.environ, SWEEP_ID_ENV: sweep_id or "", MULTIRUN_ENV: "1" if multirun else ""}
    log.info(
        "starting %d ranks on this host, one emulated accelerator each",
        cfg.accelerators_per_host,
    )
    finished = subprocess.run(command, env=env, check=False)
    path = output_dir / RESULTS
    if not path.is_file():
        raise FacebenchError(
            f"the {cfg.accelerators_per_host} ranks of this job ended (exit status "
            f"{finished.returncode}) before rank 0 wrote {path}; their lines above say why"
        )
    results = JobResults.read(path)
    if results.tracking == TRACKING_LOST:
        raise TrackingLost(
            f"run {results.run_name} finished but is not in MLflow ({results.tracking_error}); "
            f"once MLflow answers: {UPLOAD_COMMAND} {output_dir}"
        )
    if results.status != "FINISHED" or finished.returncode != 0:
        raise FacebenchError(
            f"run {results.run_name} {results.status.lower()} in its ranks (exit status "
            f"{finished.returncode}); their lines above say why"
        )
    return results.metrics
