"""NVIDIA DALI over the original image files: the industry's GPU pipeline, decoding with nvJPEG.

    records (listed in the clock) -> one shuffled order per epoch, batches dealt to ranks
      -> external_source (file bytes, CelebA or not) -> fn.decoders.image (mixed on CUDA)
      -> the crop box: CelebA's, or the whole image (fn.peek_image_shape, in the graph)
      -> fn.slice (the crop box, black where a small image ends)
      -> fn.resize(112x112), for crops of any other size
      -> uint8 batches and crop offsets for facebench.run.finish, as raw, webdataset and nodes

On CUDA the decoding runs on the GPU (`device="mixed"`: nvJPEG, with its CPU part in DALI's
threads) and batches arrive already on it; on a CPU, DALI's CPU backend (`device_id=None`)
decodes in its threads. `n_workers` is DALI's `num_threads` (0 means one thread), and
`loader.prefetch_factor` its `prefetch_queue_depth`. Each epoch follows the epoch plan (a full
reshuffle, the same on every rank, cut into batches; batch b goes to rank b % world_size, so
ranks get equal counts and each sample once; drop_last: the remainder is left out).

With storage=s3 the external source reads each batch's objects, storage.requests_per_worker
GETs in flight (DALI's own S3 reader, fn.readers.file over s3:// URLs, would deal the files in
its own order, not the epoch plan's); the GETs are counted with the batches.

DALI's decoders match PIL on grey and colour JPEGs and 8-bit PNGs; any other file (CMYK JPEG,
16-bit or palette PNG, other formats) is converted to an 8-bit RGB PNG by PIL first, so every
loader delivers the same pixels. A file DALI cannot decode is found by decoding that batch's files
with PIL, and named.
"""

from __future__ import annotations

import io
import logging
from collections import deque
from collections.abc import Iterator

import numpy as np
import torch

from facebench import stages
from facebench.config import LoaderConfig, Workers
from facebench.data.fast_decode import encoded_size, jpeg_components
from facebench.data.images import CELEBA_BOX, check_size, decode_sample, read_file, read_files
from facebench.data.sources import CELEBA, Record
from facebench.errors import FacebenchError
from facebench.host.extras import Requirement
from facebench.host.resources import batch_bytes
from facebench.loaders.plan import EpochPlan
from facebench.loaders.shared import Batch, LoaderContext, uint8_batch
from facebench.loaders.spec import Handover, LoaderSpec, Pixels, Traits

log = logging.getLogger(__name__)

_PNG = b"\x89PNG\r\n\x1a\n"
_PLAIN_PNG = {(8, 0), (8, 2), (8, 6)}  # (bit depth, colour type): 8-bit grey, RGB, RGBA
_BOX_ANCHOR = np.array([CELEBA_BOX[1], CELEBA_BOX[0]], dtype=np.int32)  # (top, left)
_BOX_SHAPE = np.array(
    [CELEBA_BOX[3] - CELEBA_BOX[1], CELEBA_BOX[2] - CELEBA_BOX[0]], dtype=np.int32
)


def dali_ready(data: bytes) -> bool:
    """Whether DALI decodes these bytes to PIL's pixels: grey or colour JPEGs, 8-bit PNGs."""
    if data[:8] == _PNG and data[12:16] == b"IHDR":
        return len(data) > 26 and (data[24], data[25]) in _PLAIN_PNG
    return jpeg_components(data) in (1, 3)


def as_dali_input(data: bytes, name: str) -> bytes:
    """The bytes DALI decodes: as they are, or PIL's RGB decoding as a lossless PNG. An image
    over data.max_pixels is refused from its header either way."""
    if dali_ready(data):
        check_size(*encoded_size(data), name)
        return data
    image = decode_sample(data, "", name)  # RGB, uncropped: DALI crops CelebA's box itself
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=0)
    return buffer.getvalue()


class Source:
    """DALI's external source: this rank's batches of the epoch plan, as file bytes, each with
    whether it is a CelebA image (cropped to CelebA's box; any other is kept whole) and its
    sample id. Image sizes are read in the graph (fn.peek_image_shape, in DALI's threads)."""

    def __init__(self, records: list[Record], plan: EpochPlan) -> None:
        self.records = records
        self.celeba = np.array([[record.source == CELEBA] for record in records], dtype=np.int32)
        self.batches = plan.batches()
        self.fed: deque[list[int]] = deque()  # positions of each batch DALI is working on

    def __call__(self, info: object = None) -> tuple[list[np.ndarray], ...]:
        chosen = next(self.batches).tolist()  # StopIteration ends DALI's epoch
        self.fed.append(chosen)
        paths = [self.records[position].path for position in chosen]
        # Files one after another; objects storage.requests_per_worker GETs at a time.
        files = read_files(paths)
        encoded = [
            np.frombuffer(as_dali_input(data, path), dtype=np.uint8)
            for data, path in zip(files, paths, strict=True)
        ]
        celeba = list(self.celeba[chosen])
        ids = list(np.array(chosen, dtype=np.int64).reshape(-1, 1))
        return encoded, celeba, ids


def _pipeline(source: Source, ctx: LoaderContext):
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = ctx.device.type == "cuda"

    size = ctx.geometry.resize

    # Conditionals: a batch's samples take the `if` below or not, each on its own.
    @pipeline_def(enable_conditionals=True)
    def decode():
        encoded, celeba, ids = fn.external_source(
            source=source, num_outputs=3, batch=True, no_copy=False
        )
        # The crop box: CelebA's fixed box, or the whole image (its height and width, HWC).
        whole = fn.peek_image_shape(encoded, dtype=types.INT32)[0:2]
        anchors = celeba * types.Constant(_BOX_ANCHOR)
        shapes = celeba * types.Constant(_BOX_SHAPE) + (1 - celeba) * whole
        # No EXIF rotation: PIL, and so every other loader, leaves images as stored.
        images = fn.decoders.image(
            encoded,
            device="mixed" if on_gpu else "cpu",
            output_type=types.RGB,
            adjust_orientation=False,
        )
        images = fn.slice(
            images, anchors, shapes, axis_names="HW", out_of_bounds_policy="pad", fill_values=0
        )
        # Only crops not already size x size are resized (DigiFace's 112 x 112 images are not):
        # DALI resamples even at the same size, which cost its CPU backend a quarter of its rate.
        if (shapes[0] != size) | (shapes[1] != size):
            images = fn.resize(
                images,
                resize_x=size,
                resize_y=size,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
        return images, ids

    return decode(
        batch_size=ctx.batch_size,
        num_threads=max(1, ctx.n_workers),
        device_id=(ctx.device.index or 0) if on_gpu else None,
        prefetch_queue_depth=ctx.options.prefetch_factor,
        seed=ctx.plan.seed % 2**31,
    )


class DaliBatches:
    """One epoch of DALI batches as facebench Batches (uint8 images, crop offsets, ids)."""

    def __init__(self, ctx: LoaderContext) -> None:
        self.ctx = ctx
        self.records = ctx.records
        self.labels = np.array([record.label for record in self.records], dtype=np.int64)
        self.plan = ctx.plan
        self.source = Source(self.records, self.plan)

    def __iter__(self) -> Iterator[Batch]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipeline = _pipeline(self.source, self.ctx)
        batches = None
        try:
            pipeline.build()
            batches = DALIGenericIterator([pipeline], ["images", "ids"], auto_reset=False)
            while True:
                try:
                    output = next(batches)[0]
                except StopIteration:
                    return
                except RuntimeError as error:
                    raise self._named(error) from None
                self.source.fed.popleft()
                ids = output["ids"].view(-1).cpu()
                labels = torch.from_numpy(self.labels[ids.numpy()])
                batch = uint8_batch(output["images"], labels, ids, self.plan)
                # From a bucket, the source's GETs, made in this thread when DALI asked for a
                # batch (it may run a batch or two ahead): counted with the batch it hands over.
                yield batch._replace(stages=stages.take_fetches())
        finally:
            # Stopped now, not whenever the last reference goes: a pipeline object left to the
            # garbage collector is copied into every worker a later loader forks, and its
            # finalizer there waits forever for DALI threads that do not exist in the copy.
            # (_shutdown is what Pipeline.__del__ calls; DALI is pinned.)
            del batches
            pipeline._shutdown()

    def _named(self, error: RuntimeError) -> FacebenchError:
        """The file of the failed batch that does not decode, found with PIL, named."""
        for position in self.source.fed[0] if self.source.fed else []:
            record = self.records[position]
            try:
                decode_sample(read_file(record.path), record.source, record.path)
            except FacebenchError as bad:
                return bad
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        return FacebenchError(f"loader=dali: DALI failed on a batch ({first_line})")


def worker_memory(ctx: LoaderContext) -> int:
    """Threads, not processes: the uint8 batches DALI keeps in its prefetch queue."""
    shape = (*ctx.geometry.resized, 3)
    return ctx.options.prefetch_factor * batch_bytes(ctx.batch_size, shape, normalized=False)


def build(ctx: LoaderContext) -> DaliBatches:
    return DaliBatches(ctx)


LOADER = LoaderSpec(
    options=LoaderConfig,
    build=build,
    worker_memory=worker_memory,
    traits=Traits(Handover.uint8, Pixels.close, Workers.thread),
    requires=Requirement("nvidia.dali", "dali"),
    # Decoding and resizing run in DALI's own threads, which report no per-stage times.
    stage_times=False,
    bucket_refusal=None,  # its external source reads the objects (storage/client.py)
)
