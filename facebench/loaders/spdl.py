"""SPDL (Meta's Scalable and Performant Data Loading): a pipeline of threads over the original
image files.

    source: this rank's share of the epoch plan, sample by sample
      -> aggregate(batch_size, drop_last): one batch's (sample id, record) pairs
      -> pipe(read, decode, resize and collate a batch; concurrency n_workers, in input order)
      -> sink(prefetch_factor batches)

SPDL runs its stages as asyncio tasks on a background thread, and their work on a pool of
n_workers threads in the loop's own process: no worker process, nothing pickled, no shared
memory, no copy of the listing per worker.

A task decodes a whole batch, not one sample: per-sample tasks (the decode stage before the
aggregate) ran at 1,300 images/s on 2 cores against 2,900 per batch (20,000 synthetic images,
warm): scheduling each image on the event loop cost more than decoding it. Threads decode in
parallel only as far as the work lets go of the GIL: libjpeg-turbo (simplejpeg), PIL's decoders
and torch's resize do; libspng (pyspng-seunglab) keeps it while it decodes a PNG, and so does each
image's Python around the decoders. Measured the same way, one thread ran at 3,100 images/s and
two at 2,800: here threads save memory, not time (docs/benchmarks.md).

The decoder is `loader.decoder` (default `fast`: facebench/data/fast_codecs.py), the same decode
stage as every decoding loader. With `fast` and `torchvision` the device crops each batch at the
plan's offsets; with `pil` the article's RandomCrop draws from torch's generator, which the
threads share, so its crops are random but not the plan's (loader.crop=center is exact).

SPDL's own decoders (`spdl.io`, on FFmpeg) are not used: they
need FFmpeg's shared libraries, which pip does not install (Debian's libavcodec and the rest),
and FFmpeg's JPEG decoder does not give PIL's pixels.

Stage times: the thread that loads a batch times its read, decode, transform and collate, as
nodes' and raw's threads do. A sample that fails to decode ends the epoch with its own error,
raised in the loop (SPDL alone would log it and skip the batch); any other failure inside SPDL
stops the pipeline too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from facebench.config import Decoder, LoaderConfig, Workers
from facebench.data.records import Record
from facebench.host.extras import Requirement
from facebench.host.resources import batch_bytes
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import LoaderSpec, decoder_traits


@dataclass
class Options(LoaderConfig):
    # fast: libspng and libjpeg-turbo (uint8 batches); torchvision; pil: the article's transform.
    decoder: Decoder = Decoder.fast


@dataclass(frozen=True)
class Failed:
    """A batch's error, carried down the pipeline to be raised in the loop: raised inside SPDL,
    it would be logged with its traceback and reach the loop wrapped in a PipelineFailure."""

    error: Exception


class LoadBatch:
    """One batch's (sample id, record) pairs -> the Batch, or the error that stopped it."""

    def __init__(self, stage: DecodeStage) -> None:
        self.stage = stage

    def __call__(self, items: list[tuple[int, Record]]) -> Batch | Failed:
        try:
            return self.stage.load(items)
        except Exception as error:
            return Failed(error)


class SpdlBatches:
    """One epoch's batches from an SPDL pipeline, built and started when iterated, stopped when
    the iteration ends (finished, failed or abandoned)."""

    def __init__(self, ctx: LoaderContext) -> None:
        self.stage = DecodeStage.of(ctx)
        self.plan = ctx.plan
        self.records = ctx.records
        self.threads = max(1, ctx.n_workers)
        self.batch_size = ctx.batch_size
        self.ahead = ctx.options.prefetch_factor

    def __len__(self) -> int:
        return self.plan.n_batches

    def _source(self) -> Iterator[tuple[int, Record]]:
        for position in self.plan.positions().tolist():
            yield position, self.records[position]

    def _pipeline(self) -> Any:
        from spdl.pipeline import AsyncQueue, PipelineBuilder  # an optional extra

        return (
            PipelineBuilder()
            .add_source(self._source())
            .aggregate(self.batch_size, drop_last=True)
            .pipe(
                LoadBatch(self.stage),
                concurrency=self.threads,
                output_order="input",
                name="decode",
            )
            .add_sink(self.ahead)
            # Any failure stops the pipeline (by default SPDL logs it and goes on).
            # No per-task hooks or queue statistics: facebench times the stages itself.
            .build(
                num_threads=self.threads,
                max_failures=0,
                task_hook_factory=lambda _: [],
                queue_class=AsyncQueue,
            )
        )

    def __iter__(self) -> Iterator[Batch]:
        pipeline = self._pipeline()
        with pipeline.auto_stop():
            for batch in pipeline.get_iterator():
                if isinstance(batch, Failed):
                    raise batch.error
                yield batch


def worker_memory(ctx: LoaderContext) -> int:
    """Threads, not processes: per thread, the batch it loads and its share of those waiting in
    the sink and the queue before it."""
    normalized = DecodeStage.of(ctx).normalized
    shape = (3, *ctx.geometry.cropped) if normalized else (*ctx.geometry.resized, 3)
    threads = max(1, ctx.n_workers)
    held = (threads + ctx.options.prefetch_factor + 1) * batch_bytes(
        ctx.batch_size, shape, normalized
    )
    return held // threads


def build(ctx: LoaderContext) -> Iterable[Batch]:
    return SpdlBatches(ctx)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(Workers.thread),
    requires=Requirement("spdl.pipeline", "spdl"),
    bucket_refusal=None,
)
