"""WebDataset: tar shards of the original JPEG/PNG files, read front to back, decoded in workers.

prepare.py (format=tar) writes the encoded files with their labels into tar shards, shuffled once.
Each epoch the shard list is shuffled and split among the workers (whole shards, as the article's
pickle loader does), each worker streams its tars sequentially, shuffles samples in a buffer of
`shuffle_buffer`, decodes and batches them. Sequential reads of large files instead of random
access to small ones is what it brings; the decoding cost stays.

decoder=torchvision (the default) decodes with torchvision.io into uint8 batches, which the
device crops and normalizes whole (facebench.run.finish); decoder=pil runs the article's
per-sample PIL transform. device_decode=true (CUDA only) sends CelebA's JPEG bytes to the main
process, to be decoded in batches on the GPU with nvJPEG; PNGs are decoded in the workers either
way. On a CPU device it is ignored, with a warning.

With storage=s3 the tars are where prepare.py storage=s3 uploaded them, and webdataset opens
their s3:// URLs through a handler facebench gives its `gopen` (as it has for http:// and gs://):
each tar is one GET of the whole object, counted in the storage_* metrics, then read from memory.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import webdataset as wds
from webdataset.gopen import gopen_schemes

from facebench import stages
from facebench.config import Decoder, LoaderConfig
from facebench.data.fast_decode import jpeg_components
from facebench.data.images import read_file
from facebench.data.sources import CELEBA
from facebench.data.transforms import Geometry
from facebench.errors import ConfigError, FacebenchError, ShardError
from facebench.loaders import shared
from facebench.loaders.decoding import DecodeStage
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shardsets import (
    ShardGuard,
    ensure_loader_shards,
    open_shard_set,
    trusted_manifest,
)
from facebench.loaders.shared import (
    Batch,
    LoaderContext,
    data_loader,
    stamped,
)
from facebench.loaders.spec import LoaderSpec, decoder_traits
from facebench.shards.manifest import Folder, ShardEntry, entry_name, read_index
from facebench.shards.tar_format import IMAGE_KEYS

log = logging.getLogger(__name__)


@dataclass
class Options(LoaderConfig):
    # Samples each worker shuffles after reading them from its shards.
    shuffle_buffer: int = 1000
    # torchvision: torchvision.io + batched tensor transforms; pil: the article's PIL transform.
    decoder: Decoder = Decoder.torchvision
    # CUDA only: decode CelebA's JPEGs in batches on the GPU.
    device_decode: bool = False


class Decode:
    """A tar sample -> (image, label, id): a transformed tensor (pil), uint8 112x112 HWC
    (torchvision), or, for JPEGs left to the GPU, the encoded bytes.

    Labels and ids in a tar carry no checksum, so each is checked against the shard's index,
    whose hash the manifest holds: a damaged shard stops the run rather than mislabel a sample.
    """

    def __init__(
        self,
        stage: DecodeStage,
        keep_jpeg: bool,
        folder: Folder,
        shards: list[ShardEntry],
        guard: ShardGuard,
    ) -> None:
        self.stage = stage
        self.keep_jpeg = keep_jpeg
        self.folder = folder
        self.shards = {shard.name: shard for shard in shards}
        self.guard = guard
        # Each shard's verified labels, read once: the shuffle buffer mixes samples of the
        # shards a worker has open, and in a bucket each index read is a GET.
        self._labels: dict[str, dict[int, int]] = {}

    def _verified(self, url: str, key: str, label_text: bytes | None) -> tuple[int, int]:
        name = entry_name(url)
        labels = self._labels.get(name)
        if labels is None:
            with self.guard.reading(url):
                index = read_index(self.folder, self.shards[name])
            labels = dict(zip(index["id"].tolist(), index["label"].tolist(), strict=True))
            self._labels[name] = labels
        try:
            sample_id, label = int(key), int(label_text or b"")
        except ValueError:
            sample_id, label = -1, -1
        if labels.get(sample_id) != label:
            with self.guard.reading(url):  # a rebuilt set says so; a damaged shard, this
                raise ShardError(
                    f"{url}: sample {key!r} has label {label_text!r}, which its verified index "
                    "does not confirm; the shard is damaged. Rebuild: python prepare.py format=tar"
                )
        return sample_id, label

    def __call__(self, sample: dict) -> tuple:
        found = [(source, key) for source, key in IMAGE_KEYS.items() if key in sample]
        if not found:
            raise ShardError(
                f"{sample.get('__url__')}: sample {sample.get('__key__')!r} has no "
                "image; the shard is damaged. Rebuild: python prepare.py format=tar"
            )
        source, data = found[0][0], sample[found[0][1]]
        sample_id, label = self._verified(sample["__url__"], sample["__key__"], sample.get("cls"))
        if self.keep_jpeg and source == CELEBA and jpeg_components(data) in (1, 3):
            # Grey or colour JPEGs go to nvJPEG; CMYK ones and anything else decode here, as
            # decode_resized does, so every loader gives the same pixels.
            return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, sample_id
        source_path = os.fsdecode(sample.get("path", b""))
        name = f"{source_path} (sample {sample['__key__']} of {sample.get('__url__')})"
        return self.stage.sample(data, source, name), label, sample_id


class ReadFailure:
    """webdataset's handler for a tar it cannot open or read: a rebuilt shard set, or this shard
    named in one line (the default handler re-raises with a traceback)."""

    def __init__(self, guard: ShardGuard) -> None:
        self.guard = guard

    def __call__(self, error: Exception) -> bool:
        if isinstance(error, FacebenchError):
            raise error
        # webdataset appends the shard's URL to the error's arguments.
        url = next((a for a in reversed(error.args) if isinstance(a, str)), "a tar shard")
        with self.guard.reading(url):
            if isinstance(error, OSError):
                raise error
            raise ShardError(f"{url}: cannot read this tar shard ({error}); rebuild it") from None
        return False


class Collate:
    """A list of decoded samples -> one Batch, as the decode stage assembles it, or, with
    device_decode, uint8 with crop offsets and the JPEGs still encoded."""

    def __init__(self, stage: DecodeStage, keep_jpeg: bool, plan: EpochPlan) -> None:
        self.stage = stage
        self.keep_jpeg = keep_jpeg
        self.plan = plan

    def __call__(self, samples: list[tuple]) -> Batch:
        labels = torch.tensor([label for _, label, _ in samples])
        ids = torch.tensor([sample_id for _, _, sample_id in samples])
        if not self.keep_jpeg:
            return self.stage.batch([image for image, _, _ in samples], labels, ids)
        start = stages.now()
        images, packed, index = _pack_jpegs(samples, self.plan.geometry)
        return stamped(Batch(images, labels, ids, self.plan.offsets(ids), (packed, index)), start)


def _pack_jpegs(
    samples: list[tuple], geometry: Geometry
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoded PNGs in a uint8 batch; JPEG bytes concatenated, with each one's length and slot.

    One tensor for all JPEG bytes crosses from the worker in one piece rather than one per image.
    """
    images = torch.zeros((len(samples), *geometry.resized, 3), dtype=torch.uint8)
    jpegs, lengths, slots = [], [], []
    for slot, (image, _, _) in enumerate(samples):
        if image.dim() == 1:
            jpegs.append(image)
            lengths.append(len(image))
            slots.append(slot)
        else:
            images[slot] = image
    packed = torch.cat(jpegs) if jpegs else torch.empty(0, dtype=torch.uint8)
    return images, packed, torch.tensor([lengths, slots], dtype=torch.int64).reshape(2, -1)


ENCODED_SAMPLE_BYTES = 32 * 2**10  # a sample waiting in the shuffle buffer, still encoded


def open_object(url: str, mode: str = "rb", bufsize: int = 8192, **kw: object) -> io.BytesIO:
    """webdataset's gopen handler for s3:// URLs: the tar, one GET, whole, in memory."""
    return io.BytesIO(read_file(url))


# webdataset's own dispatch table (the package re-exports the function gopen as wds.gopen).
gopen_schemes["s3"] = open_object


def worker_memory(ctx: LoaderContext) -> int:
    held = ctx.options.shuffle_buffer * ENCODED_SAMPLE_BYTES
    if isinstance(ctx.shards_dir, str):  # a tar from a bucket is held whole while it is read
        held += max((shard.bytes for shard in trusted_manifest(ctx).shards), default=0)
    return shared.worker_memory(ctx, normalized=DecodeStage.of(ctx).normalized, held=held)


def set_up(ctx: LoaderContext) -> dict[str, float]:
    """Once per job: check the options, and build the tar shards if missing."""
    options: Options = ctx.options
    if options.device_decode and DecodeStage.of(ctx).normalized:
        raise ConfigError(
            f"loader.device_decode=true needs a decoder whose batches the device finishes "
            f"(loader.decoder=torchvision or fast), not loader.decoder={options.decoder}"
        )
    if options.device_decode and ctx.device.type != "cuda":
        log.warning("loader.device_decode=true needs a CUDA device; decoding on the CPU instead")
    return ensure_loader_shards(ctx, "tar")


def build(ctx: LoaderContext) -> Iterable[Batch]:
    options: Options = ctx.options
    shard_set = open_shard_set(ctx)
    stage = DecodeStage.of(ctx)
    keep_jpeg = options.device_decode and ctx.device.type == "cuda" and not stage.normalized
    # A new shard order each epoch, drawn from the epoch plan's seed (the same on every rank:
    # they agree on the order, then split it) before split_by_worker hands each its share.
    plan = ctx.plan
    urls = shard_set.paths()
    urls = [urls[i] for i in np.random.default_rng(plan.seed).permutation(len(urls))]
    decode = Decode(stage, keep_jpeg, shard_set.folder, shard_set.manifest.shards, shard_set.guard)
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        wds.tarfile_to_samples(handler=ReadFailure(shard_set.guard)),
        stages.timed_items,  # getting each sample from the tars is the read stage
        wds.shuffle(options.shuffle_buffer, seed=plan.seed),
        wds.map(decode),
        wds.batched(
            ctx.batch_size,
            collation_fn=Collate(stage, keep_jpeg, plan),
            partial=False,
        ),
    )
    return data_loader(pipeline, ctx, batched=True)


LOADER = LoaderSpec(
    options=Options,
    build=build,
    worker_memory=worker_memory,
    traits=decoder_traits(),
    shard_format="tar",
    batches_per_worker=True,  # each worker batches the shards it reads
    set_up=set_up,
    bucket_refusal=None,
)
