"""The article's second pipeline, with the DataPipes built into torch (torchdata 0.10+ has none).

    IterableWrapper(CelebA records)
      .concat(FileLister(DigiFace1M, "*.png", recursive).map(to record))
      .shuffle(buffer_size)          # the article's 100,000
      .batch(batch_size, drop_last)  # see below
      .sharding_filter()
      .load_images(transform)

Folder data (data=folder): a FileLister over the class folders, or the labels CSV's rows, in place
of the two sources. From a bucket (storage=s3), a lister of the objects under the prefix
(ListObjectsV2, paged, in each worker as the FileLister is) stands in for the FileLister, and
each batch's objects are fetched together, storage.requests_per_worker GETs in flight.

Kept as the article built it, costs included: every worker lists every file and fills its own
shuffle buffer of `shuffle_buffer` records before yielding anything (time to first batch, and a
buffer's worth of memory per worker), and only then drops what belongs to the other workers. The
DataLoader gives every worker the same shuffle seed, which is what lets sharding_filter split one
order among them without gaps or repeats.

One change: batches are formed before sharding_filter, not by the DataLoader in each worker. The
article's way drops a partial batch per worker (up to n_workers * (batch_size - 1) samples an epoch;
on a small dataset, every sample). Formed here, only the epoch's one remainder is dropped, as in
loader=dataset. Each worker still decodes and transforms its samples and sends whole batches.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data.datapipes.datapipe import IterDataPipe
from torch.utils.data.datapipes.iter import FileLister, IterableWrapper

from facebench import stages
from facebench.config import Decoder, LoaderConfig
from facebench.data.folder import FOLDER, class_folder_of, image_extensions, is_image_name
from facebench.data.sample_ids import SampleIds
from facebench.data.sources import CELEBA, DIGIFACE, LabelSpace, Record, digiface_record
from facebench.loaders import shared
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shared import Batch, LoaderContext, data_loader
from facebench.loaders.spec import LoaderSpec, decoder_traits
from facebench.storage import objects
from facebench.storage.address import in_bucket, parse

PipeRecord = tuple[str, int, str, int]  # path, label, source, sample id


@dataclass
class Options(LoaderConfig):
    # Records held by each worker's Shuffler; the article's 100,000.
    shuffle_buffer: int = 100_000
    # pil: the article's PIL transform per sample; fast or torchvision: uint8 batches.
    decoder: Decoder = Decoder.pil


class Keep:
    """What the other loaders list too: <DigiFace1M>/<folder>/<file>.png, one level down, less
    what on_bad_sample=skip left out (picklable, for the workers)."""

    def __init__(self, digiface: str, excluded: frozenset[str]) -> None:
        self.digiface = digiface
        self.excluded = excluded

    def __call__(self, path: str) -> bool:
        return os.path.dirname(os.path.dirname(path)) == self.digiface and path not in self.excluded


class DigiFaceRecord:
    """A DigiFace path from the FileLister -> (path, label, source, sample id)."""

    def __init__(self, labels: LabelSpace, ids: SampleIds) -> None:
        self.labels = labels
        self.ids = ids

    def __call__(self, path: str) -> PipeRecord:
        record = digiface_record(path, self.labels)
        return record.path, record.label, record.source, self.ids(path)


class KeepClassImage:
    """What folder_records lists too: image files under a class folder, less what
    on_bad_sample=skip left out (picklable, for the workers)."""

    def __init__(self, root: str, classes: dict[str, int], excluded: frozenset[str]) -> None:
        self.root = root
        self.classes = classes
        self.extensions = image_extensions()
        self.excluded = excluded

    def __call__(self, path: str) -> bool:
        return (
            class_folder_of(self.root, path) in self.classes
            and is_image_name(path, self.extensions)
            and path not in self.excluded
        )


class FolderRecord:
    """A class folder's file from the FileLister -> (path, label, source, sample id)."""

    def __init__(self, root: str, classes: dict[str, int], ids: SampleIds) -> None:
        self.root = root
        self.classes = classes
        self.ids = ids

    def __call__(self, path: str) -> PipeRecord:
        label = self.classes[class_folder_of(self.root, path)]
        return path, label, FOLDER, self.ids(path)


class TakeFirst(IterDataPipe):
    """The first n items (torch's built-in DataPipes have no Header)."""

    def __init__(self, source_datapipe: IterDataPipe, n: int) -> None:
        self.source_datapipe = source_datapipe
        self.n = n

    def __iter__(self) -> Iterator:
        yield from itertools.islice(self.source_datapipe, self.n)


class BucketLister(IterDataPipe):
    """The s3:// address of every object under a prefix, as FileLister gives a folder's files:
    one paged ListObjectsV2, made where it is iterated (in each worker, inside the clock)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __iter__(self) -> Iterator[str]:
        address = parse(self.prefix)
        for entry in objects.list_objects(address):
            yield str(address.child(entry.key))


def _lister(folder: str, png_only: bool) -> IterDataPipe:
    """A folder's files, or a prefix's objects, recursively."""
    if in_bucket(folder):
        found = BucketLister(folder)
        return found.filter(IsPng()) if png_only else found
    return FileLister(folder, masks="*.png" if png_only else "", recursive=True)


class IsPng:
    def __call__(self, path: str) -> bool:
        return path.endswith(".png")


@torch.utils.data.functional_datapipe("timed_as_read")
class TimedAsRead(IterDataPipe):
    """The records as the listing and the shuffle buffer give them; the time to get each is
    the read stage: finding the files is part of getting their bytes, and every worker lists
    every file and fills its own buffer."""

    def __init__(self, source_datapipe: IterDataPipe) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[PipeRecord]:
        return stages.timed_items(self.source_datapipe)


@torch.utils.data.functional_datapipe("load_images")
class ImageBatchLoader(IterDataPipe):
    """Decode and transform each batch of records; yield one Batch."""

    def __init__(self, source_datapipe: IterDataPipe, stage: DecodeStage) -> None:
        self.source_datapipe = source_datapipe
        self.stage = stage

    def __iter__(self) -> Iterator[Batch]:
        for records in self.source_datapipe:
            # Files read and decoded one by one; a bucket's objects fetched together first.
            samples = self.stage.samples([Record(p, label, s) for p, label, s, _ in records])
            labels = torch.tensor([label for _, label, _, _ in records])
            ids = torch.tensor([sample_id for _, _, _, sample_id in records])
            yield self.stage.batch(samples, labels, ids)


def listed(ctx: LoaderContext) -> IterDataPipe:
    """Every sample as the article's pipeline finds it: CelebA's records (from its label file,
    read before the clock, as the article did), then a FileLister over DigiFace1M, listed by
    each worker inside the clock; a folder data set's FileLister over its class folders, or its
    labels CSV's rows."""
    records = [(r.path, r.label, r.source, i) for i, r in enumerate(ctx.records)]
    if ctx.layout.kind == "folder":
        if ctx.layout.labels:
            return IterableWrapper(records, deepcopy=False)
        root = str(ctx.data_root)
        ids = SampleIds([r.path for r in ctx.records])
        classes = ctx.labels.class_map()
        files = _lister(root, png_only=False).filter(KeepClassImage(root, classes, ctx.excluded))
        return files.map(FolderRecord(root, classes, ids))
    celeba = [record for record in records if record[2] == CELEBA]
    ids = SampleIds([r.path for r in ctx.records if r.source != CELEBA], offset=len(celeba))
    root = str(ctx.data_root)
    folder = str(parse(root).child(DIGIFACE)) if in_bucket(root) else str(Path(root) / DIGIFACE)
    digiface = _lister(folder, png_only=True).filter(Keep(folder, ctx.excluded))
    return IterableWrapper(celeba, deepcopy=False).concat(
        digiface.map(DigiFaceRecord(ctx.labels, ids))
    )


def build_datapipe(ctx: LoaderContext) -> IterDataPipe:
    options: Options = ctx.options
    pipe = listed(ctx)
    pipe = pipe.shuffle(buffer_size=options.shuffle_buffer).timed_as_read()
    pipe = pipe.batch(ctx.batch_size, drop_last=True)
    if ctx.world.distributed:
        # The DataLoader splits batches across ranks, then workers; keeping the plan's number
        # for each rank, no rank waits for another's gradients.
        pipe = TakeFirst(pipe, ctx.plan.n_batches * ctx.world.world_size)
    pipe = pipe.sharding_filter()
    return pipe.load_images(stage=DecodeStage.of(ctx))


# A record in a worker's listing or shuffle buffer: a tuple of path, label, source and id.
_RECORD_BYTES = 400


def worker_memory(ctx: LoaderContext) -> int:
    """Every worker lists every file and fills its own shuffle buffer."""
    n = len(ctx.records)
    held = _RECORD_BYTES * (n + min(ctx.options.shuffle_buffer, n))
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized, held=held)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    return data_loader(build_datapipe(ctx), ctx, shuffle=True, batched=True)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    bucket_refusal=None,
)
