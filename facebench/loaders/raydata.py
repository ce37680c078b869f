"""Ray Data over the original image files: decoding in Ray tasks, on this machine or a cluster.

    this rank's share of the epoch plan, as rows (sample id, path, label, source), in blocks
    of whole batches (one, or as many as loader.images_per_task holds)
      -> map_batches(LoadBatch, batch_size): the shared decode stage reads, decodes, transforms
         and collates each batch of a block, in a Ray task (1 CPU) on whichever node has a free
         CPU
      -> iter_torch_batches(batch_size, prefetch_batches=loader.prefetch_factor), in order

The job's Ray (facebench/loaders/ray_cluster.py): with no `loader.address`, a local instance
of n_workers CPUs and a bounded object store, started before the first epoch's clock and
stopped when the job ends; with `loader.address=auto` (or host:port, ray://host:port), a running
cluster, joined and left running. Its start-up is `ray_start_s`, outside every epoch.

Order, rank split and crops are the epoch plan's, as for every loader: each block holds whole
batches of the plan, Ray Data keeps their order (`preserve_order`), so iter_torch_batches cuts
them where the plan does, and uint8 batches carry the plan's crop offsets. torchrun ranks each
run their own Dataset over their share of the plan (batch b goes to rank b % world_size), not
`streaming_split`: the ranks are separate Ray drivers with no Dataset in common, and
streaming_split hands a block to whichever rank asks first, so ranks would not get the plan's
batches.

Stage times: each task runs the shared decode stage, which times read, decode, transform and
collate in the Ray worker; they travel with the batch, as a column. Ray's own per-operator
statistics (`Dataset.stats()`) are logged after each epoch and kept as ray_* metrics: the task
count, the nodes used, the tasks' CPU time (the four stages together plus Ray's block building:
not broken down) and the time the loop was blocked on Ray's iterator (facebench's `wait`).

From a bucket (storage=s3) each task fetches its batch's objects with the job's endpoint (it
travels in LoadBatch; the credentials come from the task's environment, which a local Ray
inherits from the job and a cluster's nodes must have), storage.requests_per_worker GETs in
flight, and the GETs travel with the batch in a column of their own.

A sample that fails to decode ends the epoch with its own error. A Ray worker that dies ends it
too, in one line (Ray Data would run the batch again, forever: `loader.max_retries` allows that
many runs again).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from facebench import stages
from facebench.config import Decoder, LoaderConfig, Workers
from facebench.data.records import Record
from facebench.fetches import Fetches
from facebench.host.extras import Requirement
from facebench.host.resources import batch_bytes
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.failures import descriptors_left, too_many_open_files
from facebench.loaders.ray_cluster import ray_cluster
from facebench.loaders.ray_errors import BatchFailed, ray_errors
from facebench.loaders.ray_measure import (
    fetch_rows,
    fetches_of,
    ray_metrics,
    stage_rows,
    stage_times,
)
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import LoaderSpec, decoder_traits
from facebench.storage import client
from facebench.storage.address import in_bucket

log = logging.getLogger(__name__)

# A Ray worker process's own memory: an interpreter of its own (spawned, not forked: nothing
# shared with the loop's) with torch, pyarrow, Ray Data and the decoders imported. Measured
# on the pinned versions: 455 MB unique to each (818 MB resident) once warmed.
RAY_WORKER_BYTES = 460 * 2**20
_MIN_OBJECT_STORE = 512 * 2**20


@dataclass
class Options(LoaderConfig):
    # fast: libspng and libjpeg-turbo (uint8 batches); torchvision; pil: the article's transform.
    decoder: Decoder = Decoder.fast
    # Empty: a local Ray instance of n_workers CPUs, for this job only. "auto" (a cluster this
    # machine belongs to), "host:port" (its head, `ray start --head`) or "ray://host:10001":
    # join that cluster, use all its CPUs, leave it running.
    address: str = ""
    # The local instance's object store, MB (0: four times the batches in flight, >= 512 MB).
    object_store_mb: int = 0
    # Images a Ray task decodes, in whole batches (at least one): small batches share a task,
    # whose overhead (scheduling, its block's trip through the object store: 10-20 ms here)
    # would otherwise cost more than decoding them.
    images_per_task: int = 256
    # Runs again of a batch whose Ray worker died (Ray Data's own default: without end). 0: the
    # epoch ends, in one line, rather than hiding the lost time in its rate.
    max_retries: int = 0


class LoadBatch:
    """In a Ray task: one batch's rows (sample id, path, label, source) -> its columns, by the
    shared decode stage, with its stage times as a column (on the first row)."""

    def __init__(self, stage: DecodeStage, timing: bool, endpoint: client.Endpoint | None) -> None:
        self.stage = stage
        self.timing = timing
        self.endpoint = endpoint  # data in a bucket: the job's endpoint, for the task's client

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        stages.set_timing(self.timing)  # a Ray worker is a process of its own
        if self.endpoint is not None:
            client.configure(self.endpoint)  # the same one again keeps its clients
        items = [
            (int(sample_id), Record(os.fsdecode(path), int(label), str(source)))
            for sample_id, path, label, source in zip(
                rows["id"], rows["path"], rows["label"], rows["source"], strict=True
            )
        ]
        try:
            batch = self.stage.load(items)
        except Exception as error:
            raise BatchFailed(error) from None
        columns = {
            "images": batch.images.numpy(),
            "labels": batch.labels.numpy(),
            "ids": batch.ids.numpy(),
            "stages": stage_rows(batch.stages, len(items)),
        }
        if batch.offsets is not None:
            columns["offsets"] = batch.offsets.numpy()
        if self.endpoint is not None:  # every batch's column, as Ray's blocks need
            fetches = batch.stages.fetches if batch.stages is not None else None
            columns["fetches"] = fetch_rows(fetches or Fetches(), len(items))
        return columns


class RayBatches:
    """One epoch's batches from a Ray Dataset, built and run when iterated; Ray's statistics
    of it (`epoch_metrics`) once it ended."""

    def __init__(self, ctx: LoaderContext) -> None:
        self.plan = ctx.plan
        self.records = ctx.records
        self.batch_size = ctx.batch_size
        self.options = ctx.options
        bucket = in_bucket(str(ctx.data_root))
        self.load = LoadBatch(
            DecodeStage.of(ctx), stages.timing(), client.configured() if bucket else None
        )
        self.batches_per_task = max(1, ctx.options.images_per_task // ctx.batch_size)
        self.dataset: Any = None

    def __len__(self) -> int:
        return self.plan.n_batches

    def _dataset(self) -> Any:
        import pyarrow as pa
        import ray.data

        positions = self.plan.positions()
        chosen = [self.records[position] for position in positions.tolist()]
        table = pa.table(
            {
                "id": pa.array(positions, type=pa.int64()),
                # Bytes: a file name need not be UTF-8 (os.fsencode keeps what the OS gave).
                "path": pa.array([os.fsencode(record.path) for record in chosen], pa.binary()),
                "label": pa.array([record.label for record in chosen], type=pa.int64()),
                "source": pa.array([record.source for record in chosen], type=pa.string()),
            }
        )
        size = self.batch_size
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the plan's order, batch after batch
        context.enable_progress_bars = False  # the epoch's own progress bar shows it
        context.raise_original_map_exception = True  # a bad file's own error, not Ray's wrapper
        rows = size * self.batches_per_task
        blocks = [table.slice(start, rows) for start in range(0, table.num_rows, rows)]
        with warnings.catch_warnings():
            # max_retries has no named parameter in Ray Data 2.60; passed as a remote argument.
            warnings.simplefilter("ignore", DeprecationWarning)
            return ray.data.from_arrow(blocks).map_batches(
                self.load,
                batch_size=size,
                batch_format="numpy",
                num_cpus=1,
                max_retries=self.options.max_retries,
            )

    def __iter__(self) -> Iterator[Batch]:
        if self.plan.n_batches == 0:
            return
        self.dataset = self._dataset()
        columns = self.dataset.iter_torch_batches(
            batch_size=self.batch_size,
            drop_last=True,
            prefetch_batches=self.options.prefetch_factor,
            device="cpu",  # facebench.run.finish copies to the device, as for every loader
        )
        batches = iter(columns)
        try:
            with ray_errors():
                while (batch := _next_batch(batches)) is not None:
                    times = stage_times(batch["stages"])
                    if "fetches" in batch and times is not None:
                        times = dataclasses.replace(times, fetches=fetches_of(batch["fetches"]))
                    yield Batch(
                        batch["images"],
                        batch["labels"],
                        batch["ids"],
                        batch.get("offsets"),
                        stages=times,
                    )
        finally:
            batches.close()  # an epoch cut short: Ray Data's executor stops now, not at GC

    def epoch_metrics(self) -> dict[str, float]:
        """Ray's own statistics of the epoch's execution (ray_*), logged in one line."""
        if self.dataset is None:
            return {}
        try:
            summary = self.dataset._get_stats_summary()  # what Dataset.stats() prints
        except Exception as error:  # statistics are a report, never a reason to fail the run
            log.warning("raydata: Ray's statistics of this epoch are not available (%s)", error)
            return {}
        return ray_metrics(summary)


def _next_batch(batches: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
    """The epoch's next batch from Ray, or None at its end; refused where this process has no
    descriptor left. Ray's driver opens a connection for each worker it leases and each actor
    it calls (Ray Data's autoscaling coordinator) as the epoch goes on, and retries one that
    fails with EMFILE without end: waiting for the batch would then never return."""
    if descriptors_left() == 0:
        raise too_many_open_files("raydata")
    return next(batches, None)


def object_store_bytes(ctx: LoaderContext) -> int:
    """The local instance's object store: loader.object_store_mb, or room for four times the
    batches in flight (each task's output, those prefetched), at least 512 MB."""
    if ctx.options.object_store_mb:
        return ctx.options.object_store_mb * 2**20
    in_flight = max(1, ctx.n_workers) + ctx.options.prefetch_factor
    return max(_MIN_OBJECT_STORE, 4 * in_flight * _batch_bytes(ctx))


def _batch_bytes(ctx: LoaderContext) -> int:
    normalized = DecodeStage.of(ctx).normalized
    shape = (3, *ctx.geometry.cropped) if normalized else (*ctx.geometry.resized, 3)
    return batch_bytes(ctx.batch_size, shape, normalized)


def worker_memory(ctx: LoaderContext) -> int:
    """A Ray worker process: its interpreter and libraries, the batch it builds, and its share
    of the local object store."""
    workers = max(1, ctx.n_workers)
    store = 0 if ctx.options.address else object_store_bytes(ctx) // workers
    return RAY_WORKER_BYTES + 2 * _batch_bytes(ctx) + store


@contextmanager
def session(ctx: LoaderContext) -> Iterator[dict[str, float]]:
    """The job's Ray, for all its epochs: its start-up metrics (ray_start_s, ray_nodes,
    ray_cpus)."""
    with ray_cluster(ctx.options.address, max(1, ctx.n_workers), object_store_bytes(ctx)) as on:
        yield on.metrics()


def build(ctx: LoaderContext) -> RayBatches:
    return RayBatches(ctx)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(Workers.process),
    requires=Requirement("ray.data", "ray"),
    session=session,
    # Ray's object store holds the batches, in /dev/shm or, where that is too small, /tmp.
    through_shared_memory=False,
    bucket_refusal=None,  # each task's GETs, with the job's endpoint (LoadBatch)
)
