"""What every loader receives and yields, and the DataLoader settings they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    default_collate,
    get_worker_info,
)

from facebench import stages
from facebench.config import LoaderConfig
from facebench.config.schema import ROW_GROUP_SIZE
from facebench.data.listing import Listing
from facebench.data.sources import FACES, LabelSpace, Layout, Record
from facebench.data.transforms import ARTICLE, Geometry
from facebench.host.distributed import World
from facebench.host.resources import WORKER_OWN_BYTES, batch_bytes
from facebench.loaders.plan import EpochPlan, epoch_seed
from facebench.stages import StageTimes


class Batch(NamedTuple):
    """A batch as a loader hands it over: exactly what a GPU run copies to the device.

    images: normalized (n, 3, 100, 100) float32, or, when `offsets` is given, (n, 112, 112, 3)
    uint8 that the device still crops (at `offsets`) and normalizes (facebench.run.finish): a
    quarter of the bytes cross between processes and over the bus, and the arithmetic runs where
    it is cheapest. ids: each sample's canonical position (data.sample_ids), None where there are
    no real samples. jpegs: CelebA JPEGs left encoded for the GPU to decode, as (concatenated
    bytes, (2, k) lengths and slots in the batch). stages: where its producer's time went
    (facebench.stages), None where nothing was timed.
    """

    images: torch.Tensor
    labels: torch.Tensor
    ids: torch.Tensor | None
    offsets: torch.Tensor | None = None
    jpegs: tuple[torch.Tensor, torch.Tensor] | None = None
    stages: StageTimes | None = None


def stamped(batch: Batch, collate_started: int) -> Batch:
    """The batch with its producer's stage times, the time since `collate_started` (a
    `stages.now()` reading taken as its assembly began) counted as collate; in a DataLoader
    worker, in shared memory (`in_shared_memory`)."""
    if get_worker_info() is not None:
        batch = in_shared_memory(batch)
    stages.lap(stages.COLLATE, collate_started)
    return batch._replace(stages=stages.take())


def in_shared_memory(batch: Batch) -> Batch:
    """Every tensor of the batch in shared memory, as a worker process hands it over.

    A tensor not yet there is moved when the batch is sent, by the queue's feeder thread, which
    only prints an error there and drops the batch: with /dev/shm full the loop would wait for
    it forever. Moved here, in the worker's own code, the error reaches the loop (DataLoader,
    torchdata.nodes and LitData forward a worker's exceptions). default_collate already puts
    what it builds there; for those tensors this costs nothing."""
    tensors = [batch.images, batch.labels, batch.ids, batch.offsets, *(batch.jpegs or ())]
    for tensor in tensors:
        if tensor is not None:
            tensor.share_memory_()
    return batch


def stack(samples: list[torch.Tensor] | list[Any]) -> torch.Tensor:
    """Samples (tensors or arrays) -> one batch tensor. In a DataLoader worker it is made in
    shared memory (default_collate does so), so that sending it to the loop copies nothing:
    otherwise the queue copies each batch into shared memory once more, in the worker."""
    return default_collate(samples)


def collate_samples(samples: list[tuple]) -> Batch:
    """(image, label, id) samples -> one normalized Batch (the DataLoader's collate_fn)."""
    start = stages.now()
    return stamped(Batch(*default_collate(samples)), start)


class CollateUint8:
    """(uint8 image, label, id) samples -> one uint8 Batch with the plan's crop offsets, for the
    device to finish (a DataLoader's collate_fn; picklable, for its workers)."""

    def __init__(self, plan: EpochPlan) -> None:
        self.plan = plan

    def __call__(self, samples: list[tuple]) -> Batch:
        start = stages.now()
        images, labels, ids = default_collate(samples)
        return stamped(uint8_batch(images, labels, ids, self.plan), start)


@dataclass(frozen=True)
class LoaderContext:
    """Everything a loader may use; built once per job, before any clock, and never changed
    (`dataclasses.replace` makes the next epoch's, or one with other workers)."""

    options: LoaderConfig  # cfg.loader: the loader's own options class
    # The data as the run listed and checked it once, before any clock: every loader reads it
    # (shard builds too), none lists the data again.
    listing: Listing
    batch_size: int
    n_workers: int
    seed: int
    device: torch.device
    transform: Callable[[Any], torch.Tensor]
    # A local folder, or an s3:// prefix (storage=s3); None for loaders that read no shards.
    shards_dir: Path | str | None
    shard_size: int
    # Samples per Parquet row group (format=parquet's setting).
    row_group_size: int = ROW_GROUP_SIZE
    # This process's place in a torchrun job; loaders split each epoch across ranks, then workers.
    world: World = field(default_factory=World)
    # Which measured epoch is being built: reshuffles, identically on every rank.
    epoch: int = 0
    on_bad_sample: str = "raise"
    verify_shards: bool = False
    # Where facebench keeps its own files (checks, generated data).
    cache: Path = Path(".cache")
    # How data_root is laid out, for the loaders that find its files themselves (datapipe).
    layout: Layout = FACES
    # Resize, crop and normalization sizes (transform.*): what `transform` applies per sample,
    # and what uint8 batches hold and the device finishes.
    geometry: Geometry = ARTICLE
    # A user's own pipeline, built before the clock (loader=custom: facebench/custom/).
    own: Any = None

    @property
    def data_root(self) -> Path:
        return self.listing.root

    @property
    def labels(self) -> LabelSpace:
        return self.listing.labels

    @property
    def records(self) -> list[Record]:
        """Every usable sample, in canonical order: its position is its id."""
        return self.listing.usable.records

    @property
    def excluded(self) -> frozenset[str]:
        """Paths on_bad_sample=skip left out; loaders that find files themselves drop them."""
        return self.listing.usable.excluded

    @property
    def plan(self) -> EpochPlan:
        """This epoch's traversal (facebench/loaders/plan.py)."""
        return EpochPlan(
            epoch_seed(self.seed, self.epoch),
            len(self.records),
            self.batch_size,
            self.world,
            self.options.crop,
            self.geometry,
        )

    @property
    def pin_memory(self) -> bool:
        # Pinned host memory only helps copies to a CUDA device; elsewhere it costs RAM.
        return self.device.type == "cuda"


class PlanSampler(Sampler[int]):
    """A DataLoader's sampler that follows the epoch plan: this rank's share of its order."""

    def __init__(self, plan: EpochPlan) -> None:
        self.positions = plan.positions().tolist()

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[int]:
        return iter(self.positions)


def data_loader(
    dataset: Dataset | IterableDataset,
    ctx: LoaderContext,
    batched: bool = False,
    sampler: Sampler | None = None,
    shuffle: bool | None = None,
    collate: Callable[[list[tuple]], Batch] = collate_samples,
    start_method: str | None = None,
    worker_init: Callable[[int], None] | None = None,
) -> Iterable[Batch]:
    """A torch DataLoader with the settings every loader shares (drop_last, as the article).

    batched=True: the dataset yields whole batches itself, and the DataLoader only moves them.
    shuffle=True: a DataPipe's shufflers run (seeded by the DataLoader); map-style datasets
    take their order from `sampler` (the epoch plan's); `collate` makes their batches.
    start_method: how its workers start (forked, by default); worker_init: run in each.
    """
    generator = torch.Generator()
    # Every worker's base seed (its random crops), and the shuffle seed DataPipes share: the
    # epoch's, plus the rank, so that ranks crop differently.
    generator.manual_seed(ctx.plan.seed + ctx.world.rank)
    extra: dict[str, Any] = {}
    if ctx.n_workers > 0:
        extra["prefetch_factor"] = ctx.options.prefetch_factor
        if start_method is not None:
            extra["multiprocessing_context"] = start_method
        if worker_init is not None:
            extra["worker_init_fn"] = worker_init
    if not batched:
        extra["collate_fn"] = collate
    return DataLoader(
        dataset,
        batch_size=None if batched else ctx.batch_size,
        sampler=sampler,
        shuffle=shuffle,
        drop_last=not batched,
        num_workers=ctx.n_workers,
        pin_memory=ctx.pin_memory,
        generator=generator,
        **extra,
    )


def worker_memory(ctx: LoaderContext, normalized: bool = True, held: int = 0) -> int:
    """One worker's memory: its own pages, the batches it keeps ready (float32 crops, or uint8
    images when the device finishes them), and `held`, what the loader itself keeps."""
    shape = (3, *ctx.geometry.cropped) if normalized else (*ctx.geometry.resized, 3)
    ready = ctx.options.prefetch_factor * batch_bytes(ctx.batch_size, shape, normalized)
    return WORKER_OWN_BYTES + ready + held


def uint8_batch(
    images: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor, plan: EpochPlan
) -> Batch:
    """A (n, 112, 112, 3) uint8 batch with the plan's crop offsets, for the device to finish."""
    return Batch(images, labels, ids, plan.offsets(ids))
