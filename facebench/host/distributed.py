"""Several processes, one job: torchrun's environment, the process group, and whole-job metrics.

`torchrun --nproc_per_node=N train.py ...` starts N copies of train.py with RANK, WORLD_SIZE and
LOCAL_RANK set. Each trains on its share of every epoch (DistributedDataParallel: nccl on GPUs,
gloo on CPUs); rank 0 alone writes outputs and talks to MLflow, after gathering every rank's
metrics into whole-job ones.
"""

from __future__ import annotations

import atexit
import os
import statistics
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from facebench.fetches import FETCH_METRICS, Fetches


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # ranks on this machine

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# Rank 0 may build shards or decode every image for on_bad_sample=skip while the others wait:
# far longer than torch's default 10 (nccl) or 30 (gloo) minutes.
PROCESS_GROUP_TIMEOUT = timedelta(hours=12)


def world_from_env() -> World:
    """This process's place in the job, from torchrun's variables (or, in a SLURM job of several
    tasks started by Hydra's submitit launcher, from SLURM's, exported as torchrun's)."""
    if "RANK" not in os.environ and "SUBMITIT_EXECUTOR" in os.environ:
        _export_submitit_environment()
    return World(
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
    )


# Set by facebench's own launcher (facebench/run/per_host.py) for the ranks it starts: its pid.
AGENT_PID_ENV = "FACEBENCH_AGENT_PID"


def agent_pid() -> int | None:
    """The torchrun agent that started this process as a rank (None where no agent did): the
    process whose end leaves the rank running for no one. facebench's launcher passes its pid
    down, which holds even if it died before the rank asked; under a user's own torchrun, this
    process's parent as the job starts."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # set by torchrun's agent for its ranks only
        return None
    passed = os.environ.get(AGENT_PID_ENV, "")
    return int(passed) if passed.isdigit() else os.getppid()


def _export_submitit_environment() -> None:
    from submitit.helpers import TorchDistributedEnvironment

    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        # Raises, naming the variable, if torchrun's variables are half set already.
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def start(world: World, device: torch.device) -> None:
    """Join the process group (once); nccl for CUDA devices, gloo otherwise."""
    if world.distributed and not dist.is_initialized():
        if device.type == "cuda":
            # Collectives, barriers and pinning use the current device: make it this rank's GPU.
            torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl", timeout=PROCESS_GROUP_TIMEOUT, device_id=device)
        else:
            dist.init_process_group(backend="gloo", timeout=PROCESS_GROUP_TIMEOUT)
        # One group for the process's life: a sweep's jobs (Hydra runs them one after another in
        # this process) share it, and it is destroyed as the process ends, as torch's examples
        # do. Destroyed after each job, the next job's rendezvous would find the store gone.
        atexit.register(stop)


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


class StepBarrier(Joinable):
    """Where emulated accelerators meet after each step, as data-parallel training's gradient
    all-reduce makes real ones meet. A Joinable, so that under torch's Join a rank whose loader
    ran out of batches first (loaders whose workers read whole shards cannot promise every rank
    the same count) keeps answering the others' steps rather than leaving them waiting."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        # The process group's backend decides where its tensors live: nccl's on the GPU.
        self._device = device if device.type == "cuda" else torch.device("cpu")

    def __call__(self) -> None:
        Join.notify_join_context(self)
        self._meet()

    def join(self) -> Join:
        """The context in which a rank that runs out of batches answers the others' steps."""
        return Join([self])

    def _meet(self) -> None:
        dist.all_reduce(torch.zeros(1, device=self._device))

    def join_hook(self, **kwargs: Any) -> JoinHook:
        barrier = self

        class _Answer(JoinHook):
            def main_hook(self) -> None:
                barrier._meet()

        return _Answer()

    @property
    def join_device(self) -> torch.device:
        return self._device

    @property
    def join_process_group(self) -> Any:
        return dist.group.WORLD


def gather(world: World, value: Any) -> list[Any]:
    """Every rank's value, on every rank (objects, so small things only)."""
    if not world.distributed:
        return [value]
    values: list[Any] = [None] * world.world_size
    dist.all_gather_object(values, value)
    return values


def join(model: torch.nn.Module | None):
    """DDP's Join: a rank that runs out of batches early keeps answering the others' gradient
    all-reduces instead of leaving them waiting forever (loaders whose workers read whole shards
    cannot promise every rank the same number of batches)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.join()
    return nullcontext()


def whole_job(
    per_rank: list[dict[str, float]], fetches: Sequence[Fetches | None] = ()
) -> dict[str, float]:
    """One set of metrics for the job: counts summed, times from the slowest rank, stage times
    averaged, and a bucket's GETs from every rank's `fetches` pooled.

    images_per_s is every rank's samples over the slowest rank's epoch time; data wait is given
    as the mean and the max over ranks, so a straggler shows.
    """
    if len(per_rank) == 1:
        return dict(per_rank[0])
    merged = dict(per_rank[0])  # rank 0's values for what is not merged below (order metrics)
    for name in ("samples_seen", "batches", "warmup_batches", "read_mb", "peak_rss_mb"):
        values = [m[name] for m in per_rank if name in m]
        if values:
            merged[name] = float(sum(values))
    # Machine-wide already: summing would count one machine once per rank.
    merged["peak_mem_added_mb"] = max(m.get("peak_mem_added_mb", 0.0) for m in per_rank)
    slowest = max(per_rank, key=lambda m: m["epoch_time_s"])
    merged["epoch_time_s"] = slowest["epoch_time_s"]
    merged["compute_s"] = slowest["compute_s"]
    merged["time_to_first_batch_s"] = max(m["time_to_first_batch_s"] for m in per_rank)
    merged["images_per_s"] = merged["samples_seen"] / merged["epoch_time_s"]
    if all("steady_images_per_s" in m for m in per_rank):  # each rank measured one
        merged["steady_images_per_s"] = sum(m["steady_images_per_s"] for m in per_rank)
    waits = [m["data_wait_s"] for m in per_rank]
    merged["data_wait_s"] = statistics.mean(waits)
    merged["data_wait_s_max"] = max(waits)
    merged["data_wait_frac"] = statistics.mean(m["data_wait_frac"] for m in per_rank)
    merged["data_wait_frac_max"] = max(m["data_wait_frac"] for m in per_rank)
    merged["cpu_util_mean"] = statistics.mean(m.get("cpu_util_mean", 0.0) for m in per_rank)
    # Emulated accelerators, one a rank: their utilization's mean (DLIO's figure) and the
    # lowest; the time they computed, summed. (au_pass is the caller's: it knows min_au.)
    if all("au" in m for m in per_rank):
        merged["au"] = statistics.mean(m["au"] for m in per_rank)
        merged["au_min"] = min(m["au"] for m in per_rank)
        merged["accelerator_compute_s"] = sum(m["accelerator_compute_s"] for m in per_rank)
        merged["accelerator_steps"] = min(m["accelerator_steps"] for m in per_rank)
    else:  # a rank with too few steps for one: rank 0's alone would pose as the job's
        for name in ("au", "au_pass", "accelerator_compute_s", "accelerator_steps"):
            merged.pop(name, None)
    # A bucket's GETs: every rank's histograms pooled (fetches.py), so the job's percentiles
    # and mean are those of all its requests, and its rates are over the slowest rank's time.
    pooled = Fetches()
    for part in fetches or ():
        if part is not None:
            pooled.add(part)
    for name in FETCH_METRICS & merged.keys():
        del merged[name]  # rank 0's alone
    merged.update(pooled.metrics(merged["epoch_time_s"]))
    # Stage times are per image and shares: every rank handles as many images, so the job's
    # are the ranks' means.
    for name in {key for m in per_rank for key in m if key.startswith("stage_")}:
        merged[name] = statistics.mean(m[name] for m in per_rank if name in m)
    return merged
