"""A user's own pipeline beside facebench's loaders, on the same images: torchvision's
ImageFolder with a typical v2 augmentation stack (bench/shopdata.py, the example in
docs/own-pipeline.md) through loader=custom, the article's loader=dataset and loader=raw over the
generated folder set; where each one's time goes; and what facebench's probes inside the user's
pipeline cost.

    python bench/own_pipeline.py
    python bench/own_pipeline.py --rounds 5 --n-workers 2

Alternates, round after round, train.py jobs (a process each, MLflow off, model=none
host_only=true) of: the ImageFolder pipeline through loader=custom (probed: each transform timed);
the same pipeline bare (an iterable of batches facebench does not look inside: no probes at all);
loader=dataset and loader=raw with data=folder (raw's shards kept in the cache, not beside the
images, where ImageFolder would take them for a class). Prints the median steady images/s of
each, the stage split side by side, the transforms by name, and the probes' overhead: measured
(bare over probed) and counted (the probes' own time per call, times the calls per sample).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import Bench, parser, run_python, run_train

from facebench import stages
from facebench.custom.carrier import private_bytes
from facebench.custom.probes import Step, Timed, TimedSamples, instrument
from facebench.host.paths import PROJECT_ROOT, cache_dir
from facebench.report.tables import markdown

BENCH = Path(__file__).resolve().parent
SHOP = "loader.dataset._target_=shopdata.shop_images"
_HOST = ["model=none", "host_only=true"]


def _settings(root: Path, shards: Path, n_workers: int) -> dict[str, list[str]]:
    folder = ["data=folder", f"data.root={root}"]
    return {
        "custom (ImageFolder, probed)": ["loader=custom", SHOP, f"+loader.dataset.root={root}"],
        "custom, bare (no probes)": [
            "loader=custom",
            "loader.dataset._target_=own_bare.Bare",
            f"+loader.dataset.root={root}",
            f"+loader.dataset.num_workers={n_workers}",
        ],
        "dataset (data=folder)": ["loader=dataset", *folder],
        "raw (data=folder)": ["loader=raw", *folder, f"shards_dir={shards}"],
    }


def probe_cost(n: int = 200_000, batch: int = 32) -> tuple[float, float, float]:
    """What the probes cost, in microseconds: a timed transform (a Compose, timed whole) around a
    function that does nothing, one step of it, and a sample of a dataset that does nothing,
    asked for `batch` at a time (as DataLoader's fetcher asks: the load stage is timed once a
    batch)."""
    stages.begin_epoch(True)
    costs = []
    for probe in (Timed(_nothing, named=False), Step(_nothing)):
        start = time.perf_counter()
        for index in range(n):
            probe(index)
        costs.append((time.perf_counter() - start) / n * 1e6)
    samples, chunk = TimedSamples(list(range(n))), list(range(batch))
    start = time.perf_counter()
    for _ in range(n // batch):
        samples.__getitems__(chunk)
    costs.append((time.perf_counter() - start) / (n // batch * batch) * 1e6)
    stages.take()
    return costs[0], costs[1], costs[2]


def _nothing(sample: int) -> int:
    return sample


def in_one_process(
    root: Path, rounds: int, n: int = 640, batch: int = 32
) -> tuple[list[float], float]:
    """The example pipeline's CPU time per sample in this process, one thread as a worker has:
    each batch of `batch` samples bare and probed (asked for at once, as DataLoader's fetcher
    does: its transforms and __getitems__ timed) one right after the other, with the same seed,
    the first of the two alternating, so that the machine's drift falls on both; the
    probed-over-bare ratio of each round, and the bare time per sample (us)."""
    from shopdata import shop_images

    torch.set_num_threads(1)
    bare, probed = shop_images(str(root)), shop_images(str(root))
    instrument(probed)
    timed = TimedSamples(probed)
    indices = torch.randperm(len(bare), generator=torch.Generator().manual_seed(0))[:n].tolist()
    stages.begin_epoch(True)
    ratios, bare_us = [], []
    for round_ in range(rounds):
        spent = {"bare": 0.0, "probed": 0.0}
        for first in range(0, n, batch):
            chunk = indices[first : first + batch]
            order = [("bare", lambda c: [bare[i] for i in c]), ("probed", timed.__getitems__)]
            for name, fetch in order if (first // batch) % 2 else order[::-1]:
                torch.manual_seed(round_ * n + first)
                start = time.thread_time()
                fetch(chunk)
                spent[name] += time.thread_time() - start
            stages.take()
        ratios.append(spent["probed"] / spent["bare"])
        bare_us.append(spent["bare"] / n * 1e6)
    return ratios, statistics.median(bare_us)


def memory_read_cost(n: int = 20) -> float:
    """What one read of a worker's private memory costs here, in milliseconds, with torch and
    torchvision loaded as in a worker."""
    start = time.perf_counter()
    for _ in range(n):
        private_bytes()
    return (time.perf_counter() - start) / n * 1e3


def main(argv: list[str] | None = None) -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--rounds", type=int, default=5)
    arguments.add_argument("--n-workers", type=int, default=2)
    arguments.add_argument("--n-images", type=int, default=6000)
    bench = Bench.start(arguments, argv)
    args = bench.args
    made = run_python(["-m", "facebench.generate", "--layout", "folder", "--n-images",
                       str(args.n_images)])  # fmt: skip
    root = Path(made.stdout.strip())
    shards = cache_dir("") / "bench-own-pipeline-shards"
    settings = _settings(root, shards, args.n_workers)
    # shopdata.py and own_bare.py, as a user's modules: run_python puts this after the checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])
    )
    env: dict[str, str] = {}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as scratch:
        run_train(scratch, [*settings["raw (data=folder)"], *_HOST, "max_batches=1"], env)
        for round_ in range(args.rounds):
            for name, overrides in settings.items():
                common = [*_HOST, f"n_workers={args.n_workers}", "batch_size=256"]
                runs[name].append(run_train(scratch, [*overrides, *common], env))
                print(f"round {round_ + 1}: {name} done", file=sys.stderr, flush=True)
    per_transform, per_step, per_sample = probe_cost()
    sys.path.insert(0, str(BENCH))
    ratios, bare_us = in_one_process(root, args.rounds)
    counted = (per_transform, per_step, per_sample, memory_read_cost())
    bench.publish("bench:own-pipeline", _section(bench, runs, counted, (ratios, bare_us), args))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _section(bench: Bench, runs, counted, one_process, args) -> str:
    per_transform, per_step, per_sample, memory_ms = counted
    process_ratios, bare_us = one_process
    stage_names = ("load", "read", "decode", "transform", "collate")
    rows = []
    for name, results in runs.items():
        steady = [m.get("steady_images_per_s", m["images_per_s"]) for m in results]
        cells = [f"{_median([m.get(f'stage_{s}_cpu_us', 0.0) for m in results]):,.0f}"
                 if "stage_worker_us" in results[0] else "-" for s in stage_names]  # fmt: skip
        worker = _median([m.get("stage_worker_cpu_us", 0.0) for m in results])
        rows.append([name, f"{_median(steady):,.0f}", *cells, f"{worker:,.0f}" if worker else "-"])
    probed = runs["custom (ImageFolder, probed)"]
    bare = runs["custom, bare (no probes)"]
    ratios = [
        b.get("steady_images_per_s", b["images_per_s"])
        / p.get("steady_images_per_s", p["images_per_s"])
        for b, p in zip(bare, probed, strict=True)
    ]
    parts = sorted(
        ((key.removeprefix("part_").removesuffix("_us"), _median([m[key] for m in probed]))
         for key in probed[0] if key.startswith("part_") and key.endswith("_us")),
        key=lambda item: -item[1],
    )  # fmt: skip
    worker_us = _median([m["stage_worker_cpu_us"] for m in probed])
    steps = len(parts)  # each step of its Compose, timed by the wall clock alone
    counted = per_sample + per_transform + steps * per_step
    frac = {name: _median([m[f"part_{name}_frac"] for m in probed]) for name, _ in parts}
    part_rows = [[name, f"{us:,.0f}", f"{frac[name]:.0%}"] for name, us in parts]
    details = (
        f"{args.rounds} rounds alternated, n_workers={args.n_workers}, batch_size=256, "
        f"model=none host_only=true, the generated folder set ({args.n_images:,} JPEGs); "
        "nothing else ran beside it"
    )
    body = (
        "Steady images/s (median of the rounds) and the workers' CPU time per image in each "
        "stage (us, summed over workers):\n\n"
        + markdown(["run", "images/s", *stage_names, "worker CPU"], rows)
        + "\n\nInside the ImageFolder pipeline, each transform's time per image (wall, summed "
        "over workers) and its share of the stages' time:\n\n"
        + markdown(["transform", "us", "share"], part_rows)
        + "\n\nThe probes' cost, three ways. In one process, one thread (as a worker), the "
        "same 640 samples and seeds, batch by batch (32), bare and probed, CPU time probed "
        "over bare per round: "
        f"{', '.join(f'{r:.3f}' for r in process_ratios)} (median "
        f"{_median(process_ratios):.3f}; bare {bare_us:,.0f} us a sample). Counted: "
        f"{per_sample:.2f} us a sample for the load stage's timing (once a batch of 32), "
        f"{per_transform:.2f} us for a timed "
        f"Compose and {per_step:.2f} us for each of its {steps} steps: {counted:.1f} us of a "
        f"sample's {worker_us:,.0f} us "
        f"of worker CPU ({counted / worker_us:.1%}); a worker's private-memory read "
        f"{memory_ms:.1f} ms, at most 0.5% of its time. End to end (train.py jobs, steady "
        f"images/s bare over probed, per round): {', '.join(f'{r:.3f}' for r in ratios)} "
        f"(median {_median(ratios):.3f}): two workers on two cores beside the loop, a few "
        "seconds an epoch.\n"
    )
    return bench.section("Your own pipeline: ImageFolder beside facebench's loaders", details, body)


if __name__ == "__main__":
    sys.path.insert(0, str(PROJECT_ROOT))
    main()
