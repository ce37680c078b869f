"""The decode stage every loader that decodes on the CPU composes: a file (or its bytes) -> a
sample -> a batch, with each step timed here, from outside the step, as the stages of
facebench/stages.py: read, decode, transform, collate.

    stage = DecodeStage.of(ctx)                  # the loader's decoder (loader.decoder)
    samples = [stage.from_file(record) for record in records]      # read, decode, transform
    batch = stage.batch(samples, labels, ids)                       # collate, stamped
    batch = stage.load(pairs)                   # the same, from (sample id, record) pairs

A loader keeps only what makes it that loader (where its records come from, how it orders and
splits them, where its workers run); the decoder and the timing are chosen and done here once.
"""

from __future__ import annotations

from typing import Any

import torch

from facebench import stages
from facebench.data.decoders import Decoder, decoder
from facebench.data.images import read_file, read_files
from facebench.data.records import Record
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shared import Batch, LoaderContext, stack, stamped, uint8_batch
from facebench.storage.address import in_bucket


class DecodeStage:
    """One loader's decoding, timed (picklable, for worker processes)."""

    def __init__(self, chosen: Decoder, plan: EpochPlan) -> None:
        self.decoder = chosen
        self.plan = plan

    @classmethod
    def of(cls, ctx: LoaderContext) -> DecodeStage:
        """The stage for ctx's loader: its `decoder` option (the article's PIL transform for
        loaders that have none)."""
        name = getattr(ctx.options, "decoder", "pil")
        return cls(decoder(str(name), ctx.transform, ctx.geometry), ctx.plan)

    @property
    def normalized(self) -> bool:
        """Whether its batches are normalized floats, or uint8 that the device finishes."""
        return self.decoder.normalized

    def read(self, path: str) -> bytes:
        start = stages.now()
        data = read_file(path)
        stages.lap(stages.READ, start)
        return data

    def sample(self, data: bytes, source: str, name: str) -> torch.Tensor:
        """A file's bytes -> its sample: decode, then transform."""
        start = stages.now()
        image = self.decoder.decode(data, source, name)
        start = stages.lap(stages.DECODE, start)
        sample = self.decoder.transform(image)
        stages.lap(stages.TRANSFORM, start)
        return sample

    def from_file(self, record: Record) -> torch.Tensor:
        return self.sample(self.read(record.path), record.source, record.path)

    def samples(self, records: list[Record]) -> list[torch.Tensor]:
        """Several records' samples, in order: local files read and decoded one by one, as
        before; objects fetched together first (storage.requests_per_worker GETs in flight),
        the wait for them timed as the read stage."""
        if not records or not in_bucket(records[0].path):
            return [self.from_file(record) for record in records]
        start = stages.now()
        datas = read_files([record.path for record in records])
        stages.lap(stages.READ, start)
        return [
            self.sample(data, record.source, record.path)
            for data, record in zip(datas, records, strict=True)
        ]

    def load(self, items: list[tuple[int, Record]]) -> Batch:
        """(sample id, record) pairs -> their Batch: each file read, decoded, transformed, then
        collated (what a worker or thread that loads whole batches does)."""
        samples = self.samples([record for _, record in items])
        labels = torch.tensor([record.label for _, record in items])
        ids = torch.tensor([sample_id for sample_id, _ in items])
        return self.batch(samples, labels, ids)

    def transformed(self, image: Any) -> torch.Tensor:
        """An image decoded elsewhere (a pickle shard's) -> its sample."""
        start = stages.now()
        sample = self.decoder.transform(image)
        stages.lap(stages.TRANSFORM, start)
        return sample

    def batch(self, samples: list[torch.Tensor], labels: torch.Tensor, ids: torch.Tensor) -> Batch:
        """Samples -> one Batch, stamped with this thread's stage times: normalized, or uint8
        with the plan's crop offsets for the device to finish."""
        start = stages.now()
        images = stack(samples)
        if self.normalized:
            return stamped(Batch(images, labels, ids), start)
        return stamped(uint8_batch(images, labels, ids, self.plan), start)
