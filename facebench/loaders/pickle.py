"""The article's third pipeline: DataPipes over pre-shuffled pickle shards built by prepare.py.

    IterableWrapper(shard paths).shuffle().sharding_filter().load_pickle_data(transform)

Each worker unpickles whole shards of decoded images and transforms them one by one: no JPEG or
PNG decoding at train time, which (not the DataPipe API) is why the article found it fast. The
price: a worker holds a whole shard in memory, shuffling is only across shards plus the one shuffle
before writing, and with fewer shards than workers some workers have nothing to do.

The shard list comes from the manifest, not from listing the folder, and a shard's bytes are
unpickled only after their sha256 matches it. Missing or outdated shards are built before the
epoch clock starts; that time is logged as `prepare_s`. With storage=s3 each shard is one GET
of the whole object (uploaded by prepare.py storage=s3), counted in the storage_* metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils.data.datapipes.datapipe import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

from facebench import stages
from facebench.config import LoaderConfig, Workers
from facebench.loaders import shared
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.shardsets import ShardGuard, open_shard_set, trusted_manifest
from facebench.loaders.shared import Batch, LoaderContext, data_loader
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits
from facebench.shards import pickle_format
from facebench.shards.manifest import entry_name, read_verified


@torch.utils.data.functional_datapipe("load_pickle_data")
class PickleShardLoader(IterDataPipe):
    """Verify, unpickle and transform each shard named by the source pipe."""

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        stage: DecodeStage,
        sha256: dict[str, str],
        guard: ShardGuard,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.stage = stage
        self.sha256 = sha256
        self.guard = guard

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, int]]:
        for path in self.source_datapipe:
            start = stages.now()
            with self.guard.reading(path):
                data = read_verified(path, self.sha256[entry_name(path)])
            start = stages.lap(stages.READ, start)  # the shard's bytes, and their hash
            samples = pickle_format.decode(data, path)
            stages.lap(stages.DECODE, start)  # unpickling: the pixels were decoded by prepare.py
            for image, label, sample_id in samples:
                yield self.stage.transformed(image), label, sample_id


def worker_memory(ctx: LoaderContext) -> int:
    """A worker holds a whole shard: its bytes, the images unpickled from them, and a copy."""
    manifest = trusted_manifest(ctx)
    largest = max((shard.bytes for shard in manifest.shards), default=0)
    return shared.worker_memory(ctx, held=3 * largest)


def build(ctx: LoaderContext) -> Iterable[Batch]:
    shard_set = open_shard_set(ctx)
    # The shard list's shuffle is seeded by the DataLoader (the epoch plan's seed).
    pipe = IterableWrapper(shard_set.paths()).shuffle().sharding_filter()
    pipe = pipe.load_pickle_data(
        stage=DecodeStage.of(ctx), sha256=shard_set.sha256(), guard=shard_set.guard
    )
    return data_loader(pipe, ctx, shuffle=True)


LOADER = LoaderSpec(
    options=LoaderConfig,
    build=build,
    worker_memory=worker_memory,
    traits=Traits(Handover.normalized, Pixels.exact, Workers.process),
    shard_format="pickle",
    batches_per_worker=True,  # each worker batches the shards it reads
    bucket_refusal=None,
)
