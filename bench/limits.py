"""How close do the decoding loaders come to what this machine can decode? Its decode limits,
measured on the data set's own files with no loader around them, beside each loader's rate.

    python bench/limits.py                      # 20,000 synthetic images, warm

A limit is the rate of one process per usable core, running together, each working through its
share of every file (read from the page cache), one limit per decoder: read + decode + resize to
transform.resize with PIL (what dataset and datapipe do first), the same plus the article's
per-sample transform (crop, to-tensor, normalize: all their work with decoder=pil), read + decode +
resize with torchvision.io (what webdataset and nodes do with decoder=torchvision; the device crops
and normalizes), and read + decode + resize with decoder=fast (libspng and libjpeg-turbo called
directly; facebench/data/fast_codecs.py). Each decoding loader then runs host-only with n_workers
equal to the cores, with its default decoder and with decoder=fast, and its rate is given as a
share of its matching limit. loader=spdl's threads are held against the same limit as the
processes.

Then raw's limits on a CPU device, where the host both gathers each batch's records and crops
and normalizes them: finishing alone (uint8 batches already in memory), gathering alone (one
pread per record, in random order, from raw's own shards in the page cache), and the two
together (each of one thread per core gathers a batch, then finishes it). raw runs on the CPU
device with n_workers equal to the cores, and its rate is given as a share of each.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from common import Bench, generated_root, parser, run_train
from PIL import Image

from facebench.data.batch_transforms import crop_normalize_on_cpu, crop_offsets
from facebench.data.fast_decode import decode_resized, resized
from facebench.data.images import open_sample, read_file
from facebench.data.sources import CELEBA, DIGIFACE
from facebench.data.transforms import ARTICLE, article_transform
from facebench.host.paths import shards_root
from facebench.host.resources import usable_cores
from facebench.report.tables import markdown
from facebench.shards import raw_format
from facebench.shards.manifest import Manifest

PIL_TRANSFORM, PIL_RESIZE = "PIL, article transform", "PIL, resize"
TORCHVISION, FAST = "torchvision.io, resize", "fast, resize"
# Each decoding loader with a decoder, and the limit it is held against (its own decoding path).
MATCHING = [
    ("dataset", "pil", PIL_TRANSFORM),
    ("datapipe", "pil", PIL_TRANSFORM),
    ("webdataset", "torchvision", TORCHVISION),
    ("nodes", "torchvision", TORCHVISION),
    ("dataset", "fast", FAST),
    ("datapipe", "fast", FAST),
    ("webdataset", "fast", FAST),
    ("nodes", "fast", FAST),
    ("spdl", "fast", FAST),
]


def _files(root: Path) -> list[tuple[str, str]]:
    celeba = sorted((root / CELEBA / "img_align_celeba").glob("*.jpg"))
    digiface = sorted((root / DIGIFACE).glob("*/*.png"))
    return [(str(p), CELEBA) for p in celeba] + [(str(p), DIGIFACE) for p in digiface]


def _work(kind: str, files: list[tuple[str, str]]) -> None:
    if kind == TORCHVISION:
        for path, source in files:
            decode_resized(read_file(path), source, path)
        return
    if kind == FAST:
        from facebench.data.fast_codecs import decode_rgb  # the `fast` extra

        for path, source in files:
            resized(decode_rgb(read_file(path), source, path))
        return
    if kind == PIL_RESIZE:
        for path, source in files:
            open_sample(path, source).resize((112, 112), Image.Resampling.BILINEAR)
        return
    transform = article_transform()
    for path, source in files:
        transform(open_sample(path, source))


def _one(args: tuple[str, list[tuple[str, str]], object]) -> None:
    kind, files, barrier = args
    torch.set_num_threads(1)  # as DataLoader sets in its workers: one core, one thread
    barrier.wait()
    _work(kind, files)


def limit(kind: str, files: list[tuple[str, str]], processes: int) -> float:
    """Images/s of `processes` processes, each on its share of the files, started together."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes + 1)
    shares = [files[i::processes] for i in range(processes)]
    workers = [context.Process(target=_one, args=((kind, share, barrier),)) for share in shares]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"a {kind} process failed ({worker.exitcode})")
    return len(files) / (time.perf_counter() - started)


class RawShards:
    """raw's shard files, open, read the way raw reads them: one pread per record."""

    def __init__(self, folder: Path, resize: int) -> None:
        manifest = Manifest.read(folder)
        if manifest is None:
            raise SystemExit(f"{folder}: no raw shards; run train.py loader=raw first")
        self.files = [os.open(folder / shard.name, os.O_RDONLY) for shard in manifest.shards]
        self.data = [
            raw_format.data_offset(fd, shard.name, resize)
            for fd, shard in zip(self.files, manifest.shards, strict=True)
        ]
        self.starts = np.cumsum([0] + [shard.samples for shard in manifest.shards])
        self.shape = raw_format.shape(resize)

    def gather(self, positions: np.ndarray, out: np.ndarray) -> None:
        """As raw gathers a batch (the same function), without the loader around it."""
        if raw_format.gather(self.files, self.data, self.starts, positions, out) is not None:
            raise SystemExit("a raw shard is shorter than its manifest says; rebuild it")


def finishing_limit(
    shards: RawShards, steps: str, threads: int, batch_size: int, seconds: float = 4.0
) -> float:
    """Images/s of `threads` threads, each repeating `steps` ("gather", "finish" or both) on
    batches of random records, for `seconds` after all have started."""
    barrier = threading.Barrier(threads + 1)
    done = [0] * threads
    stop = threading.Event()

    def work(index: int) -> None:
        torch.set_num_threads(1)  # as facebench's finishing threads run
        rng = np.random.default_rng(index)
        images = torch.empty((batch_size, *shards.shape), dtype=torch.uint8)
        if "gather" not in steps:  # finishing alone: a batch already in memory
            shards.gather(
                np.sort(rng.choice(shards.starts[-1], batch_size, replace=False)), images.numpy()
            )
        out = torch.empty((batch_size, *ARTICLE.cropped, 3), dtype=torch.float32)
        barrier.wait()
        while not stop.is_set():
            if "gather" in steps:
                positions = np.sort(rng.choice(shards.starts[-1], batch_size, replace=False))
                shards.gather(positions, images.numpy())
            if "finish" in steps:
                offsets = torch.from_numpy(crop_offsets(batch_size, "random", rng))
                crop_normalize_on_cpu(images, offsets, out)
            done[index] += batch_size

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    counted = sum(done)
    elapsed = time.perf_counter() - started
    stop.set()
    for thread in pool:
        thread.join()
    return counted / elapsed


def decode_section(bench: Bench, n_images: int, cores: int) -> str:
    """The decode limits and each decoding loader's share, as a Markdown section."""
    with tempfile.TemporaryDirectory() as scratch:
        common = ["model=none", "host_only=true", "cache=warm", f"data.n_images={n_images}"]
        rates = [
            run_train(
                scratch,
                [f"loader={name}", f"loader.decoder={decoder}", f"n_workers={cores}", *common],
            )
            for name, decoder, _ in MATCHING
        ]
    # The loaders' runs just read every file into the page cache.
    files = _files(generated_root(n_images))
    kinds = [PIL_RESIZE, PIL_TRANSFORM, TORCHVISION, FAST]
    limits = {kind: limit(kind, files, cores) for kind in kinds}
    rows = []
    for (name, decoder, kind), metrics in zip(MATCHING, rates, strict=True):
        steady = metrics["steady_images_per_s"]
        share = f"{100 * steady / limits[kind]:.0f}%"
        rows.append([name, decoder, kind, f"{steady:,.0f}", f"{limits[kind]:,.0f}", share])
    against_pil = limits[FAST] / limits[PIL_RESIZE]
    title = (
        f"Decode limits and each decoding loader's share, {n_images:,} synthetic images, warm, "
        f"host side, n_workers {cores}"
    )
    body = (
        f"Limits: {cores} processes together, one share of the {len(files):,} files each.\n\n"
        + markdown(["limit", "images/s"], [[kind, f"{rate:,.0f}"] for kind, rate in limits.items()])
        + f"\nThe fast decoder's limit is {against_pil:.2f}x PIL's (decode and resize).\n\n"
        + markdown(["loader", "decoder", "its limit", "steady images/s", "limit", "share"], rows)
    )
    return bench.section(title, "nothing else ran meanwhile", body)


def finishing_section(bench: Bench, n_images: int, cores: int, batch_size: int = 600) -> str:
    """raw's limits on a CPU device and its share of each, as a Markdown section."""
    with tempfile.TemporaryDirectory() as scratch:
        common = ["loader=raw", f"n_workers={cores}", "model=none", "cache=warm", "repeat=3"]
        common += [f"data.n_images={n_images}", f"batch_size={batch_size}"]
        device = run_train(scratch, common)["steady_images_per_s_median"]
        host = run_train(scratch, [*common, "host_only=true"])["steady_images_per_s_median"]
    shards = RawShards(shards_root("", generated_root(n_images), "raw"), ARTICLE.resize)
    limits = {
        steps: finishing_limit(shards, steps, cores, batch_size)
        for steps in ["finish", "gather", "gather, then finish"]
    }
    alone = 1 / (1 / limits["finish"] + 1 / limits["gather"])
    rows = [
        ["finish alone (crop and normalize uint8 batches in memory)", limits["finish"]],
        ["gather alone (one pread per record, random order)", limits["gather"]],
        ["gather, then finish, in each thread", limits["gather, then finish"]],
    ]
    cells = [[what, f"{rate:,.0f}", f"{100 * device / rate:.0f}%"] for what, rate in rows]
    title = (
        f"raw's limits on a CPU device, {n_images:,} synthetic images, warm, batch {batch_size}, "
        f"{cores} threads"
    )
    body = (
        f"raw, n_workers {cores}, CPU device: {device:,.0f} images/s steady (median of 3 "
        f"epochs); host side only (`host_only=true`): {host:,.0f}.\n\n"
        + markdown(["limit, no loader", "images/s", "raw's share"], cells)
        + f"\nIf each image cost the cores its gathering and its finishing, one after the "
        f"other, the two together would run at 1 / (1/finish + 1/gather) = {alone:,.0f} "
        "images/s.\n"
    )
    return bench.section(title, "nothing else ran meanwhile", body)


def main(argv: list[str] | None = None) -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--n-images", type=int, default=20_000)
    arguments.add_argument("--parts", nargs="+", default=["decode", "finishing"])
    bench = Bench.start(arguments, argv)
    cores = usable_cores()
    for part in bench.args.parts:
        section = decode_section if part == "decode" else finishing_section
        text = section(bench, bench.args.n_images, cores)
        bench.publish(f"bench:{part}-limits", text)


if __name__ == "__main__":
    main()
