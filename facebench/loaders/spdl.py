"""SPDL (Meta's Scalable and Performant Data Loading): a pipeline of threads over the original
image files.

    source: this rank's share of the epoch plan, as (sample id, record) pairs
      -> pipe(read, decode, resize one sample; concurrency n_workers, in input order)
      -> aggregate(batch_size, drop_last)
      -> pipe(collate: one batch, with the plan's crop offsets)
      -> sink(prefetch_factor batches)

SPDL runs its stages as asyncio tasks on a background thread, and their work on a pool of
n_workers threads in the loop's own process: no worker process, nothing pickled, no shared
memory, no copy of the listing per worker. Threads decode in parallel only as far as the decoder
lets go of the GIL: libjpeg-turbo (simplejpeg), PIL's decoders and torch's resize do; libspng
(pyspng-seunglab) keeps it while it decodes a PNG, so PNGs decode one at a time (twice PIL's
speed, measured in bench/limits.py).

The decoder is `loader.decoder` (default `fast`: facebench/data/fast_codecs.py), the same
decode stage as every decoding loader. SPDL's own decoders (`spdl.io`, on FFmpeg) are not used:
they need FFmpeg's shared libraries, which pip does not install (Debian's libavcodec and
friends), and FFmpeg's PNG and JPEG decoders do not promise PIL's pixels.

Stage times: each pool thread times its own read, decode and transform per sample and hands
them over with the sample; the collating thread adds them to the batch's (stages.merge).
A sample that fails to decode ends the epoch with its own error, raised in the loop (SPDL would
otherwise log it and skip the sample); any other failure inside SPDL stops the pipeline too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from facebench import stages
from facebench.config import Decoder, LoaderConfig, Workers
from facebench.data.records import Record
from facebench.extras import Requirement
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shared import Batch, LoaderContext
from facebench.loaders.spec import LoaderSpec, decoder_traits
from facebench.resources import batch_bytes

# Samples each decode task may hold beyond its own: SPDL's queues between stages.
_QUEUED_PER_THREAD = 2


@dataclass
class Options(LoaderConfig):
    # fast: libspng and libjpeg-turbo (uint8 batches); torchvision; pil: the article's transform.
    decoder: Decoder = Decoder.fast


Sample = tuple[torch.Tensor, int, int, stages.StageTimes | None]  # image, label, id, its times


@dataclass(frozen=True)
class Failed:
    """A sample's error, carried down the pipeline to be raised in the loop: raised inside SPDL,
    it would be logged with its traceback and reach the loop wrapped in a PipelineFailure."""

    error: Exception


class LoadSample:
    """(sample id, record) -> the sample and the times this thread spent on it."""

    def __init__(self, stage: DecodeStage) -> None:
        self.stage = stage

    def __call__(self, item: tuple[int, Record]) -> Sample | Failed:
        sample_id, record = item
        try:
            image = self.stage.from_file(record)
        except Exception as error:
            return Failed(error)
        return image, record.label, sample_id, stages.take()


class Collate:
    """A list of samples -> one Batch, carrying the times of every thread that worked on it."""

    def __init__(self, stage: DecodeStage) -> None:
        self.stage = stage

    def __call__(self, samples: list[Sample | Failed]) -> Batch | Failed:
        for sample in samples:
            if isinstance(sample, Failed):
                return sample
        images = [image for image, _, _, _ in samples]
        labels = torch.tensor([label for _, label, _, _ in samples])
        ids = torch.tensor([sample_id for _, _, sample_id, _ in samples])
        batch = self.stage.batch(images, labels, ids)
        return batch._replace(stages=stages.merge([batch.stages, *(t for *_, t in samples)]))


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
            .pipe(
                LoadSample(self.stage),
                concurrency=self.threads,
                output_order="input",
                name="decode",
            )
            .aggregate(self.batch_size, drop_last=True)
            .pipe(Collate(self.stage), name="collate")
            .add_sink(self.ahead)
            # Any failure stops the pipeline (by default SPDL logs it and skips the sample).
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
    """Threads, not processes: per thread, the samples it decodes and queues, and its share of
    the batches waiting in the sink."""
    normalized = DecodeStage.of(ctx).normalized
    shape = (3, *ctx.geometry.cropped) if normalized else (*ctx.geometry.resized, 3)
    threads = max(1, ctx.n_workers)
    samples = threads * (1 + _QUEUED_PER_THREAD) + ctx.batch_size  # decoding, queued, a batch
    ready = ctx.options.prefetch_factor + 1
    held = batch_bytes(samples, shape, normalized) + ready * batch_bytes(
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
)
