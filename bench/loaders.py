"""Every loader side by side, loader-only, on the same synthetic data, cold and warm.

    python bench/loaders.py                         # 20,000 images, n_workers 0 and 2
    python bench/loaders.py --n-images 100000 --workers 2 --caches warm
    python bench/loaders.py --model resnet50        # with the model (on a GPU)

Each (loader, n_workers, cache) runs as its own `python train.py` process (so no run inherits
another's memory or workers), with MLflow off; its results.json is read back. Prints a Markdown
table and writes it into docs/benchmarks.md (--no-write to skip). Every number comes from the runs
just made. Then the compute ceilings: loader=ceiling with each --ceiling-models model, which on a
CPU shows how far below any loader the model trains.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from dataclasses import dataclass

from common import STAGE_HEADER, Bench, parser, run_train, stage_cells, steady_cell

from facebench import loaders
from facebench.loaders.spec import Handover
from facebench.report.tables import markdown
from facebench.stages import MAIN_STAGES

LOADERS = loaders.names(real_only=True)  # the registry's, never written out
HEADER = [
    "loader",
    "workers",
    "host only",
    "cache",
    "images/s",
    "steady images/s",
    "vs dataset",
    "first batch s",
    "data wait",
    "peak RSS MB",
    "memory added MB",
    "read MB",
    "CPU %",
    "order_corr",
    "cached before",
]


@dataclass(frozen=True)
class Run:
    """One row's train.py job: where it ran, and its metrics."""

    loader: str
    workers: int
    host_only: str  # "true" or "false", as the override takes it
    cache: str
    metrics: dict[str, float]

    @property
    def rate(self) -> float:
        """Whole-epoch images/s, the median over the job's epochs."""
        return self.metrics["images_per_s_median"]

    def where(self) -> list[str]:
        """The cells that name the run: loader, workers, host only, cache."""
        host = "yes" if self.host_only == "true" else "no"
        return [self.loader, str(self.workers), host, self.cache]


def crop_normalize_limit(batch_size: int, seconds: float = 3.0) -> float:
    """Images/s at which this machine crops and normalizes uint8 batches already in memory.

    The same code as a CPU device's runs (facebench.run.finish: threads ahead of the loop, one per
    core), on one batch handed over again and again. Whatever a loader does before, a CPU device
    still needs this step, so no loader that hands over uint8 batches can beat it there.
    """
    import time

    import numpy as np
    import torch

    from facebench.data.batch_transforms import crop_offsets
    from facebench.host.resources import usable_cores
    from facebench.loaders.shared import Batch
    from facebench.run.finish import finished_ahead_on_cpu

    rng = np.random.default_rng(0)
    images = torch.randint(0, 256, (batch_size, 112, 112, 3), dtype=torch.uint8)
    offsets = torch.from_numpy(crop_offsets(batch_size, "random", rng))
    labels = torch.zeros(batch_size, dtype=torch.int64)
    batch = Batch(images, labels, labels, offsets)
    done, start = 0, None
    for _ in finished_ahead_on_cpu(itertools.repeat(batch), usable_cores()):
        if start is None:  # the first batch starts the threads and touches the buffers
            start = time.perf_counter()
            continue
        done += batch_size
        if time.perf_counter() - start >= seconds:
            break
    return done / (time.perf_counter() - start)


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    arguments.add_argument("--n-images", type=int, default=20_000)
    arguments.add_argument("--loaders", nargs="+", default=LOADERS)
    arguments.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    arguments.add_argument("--caches", nargs="+", default=["warm", "cold"])
    arguments.add_argument(
        "--host-only",
        nargs="+",
        default=["false"],
        choices=["false", "true"],
        help="true: stop where a GPU run hands the batch to the device (host_only=true)",
    )
    arguments.add_argument("--batch-size", type=int, default=600)
    arguments.add_argument("--model", default="none")
    arguments.add_argument("--ceiling-models", nargs="*", default=["resnet18", "resnet50"])
    arguments.add_argument("--ceiling-batches", type=int, default=3)
    arguments.add_argument("--repeat", type=int, default=2)
    arguments.add_argument("--device", default="auto")
    arguments.add_argument("--section", default="loaders")
    arguments.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    return Bench.start(arguments, argv)


def run_loaders(args: argparse.Namespace, common: list[str], scratch: str) -> list[Run]:
    """Every (cache, host_only, n_workers, loader), in that order, each its own job."""
    runs = []
    for cache, host_only, workers in itertools.product(args.caches, args.host_only, args.workers):
        for loader in args.loaders:
            overrides = [
                f"loader={loader}",
                f"n_workers={workers}",
                f"cache={cache}",
                f"model={args.model}",
                f"repeat={args.repeat}",
                f"host_only={host_only}",
                *common,
            ]
            runs.append(Run(loader, workers, host_only, cache, run_train(scratch, overrides)))
    return runs


def run_ceilings(args: argparse.Namespace, common: list[str], scratch: str) -> list[list[str]]:
    """The compute ceiling's rows: loader=ceiling with each --ceiling-models model."""
    rows = []
    for model in args.ceiling_models:
        overrides = ["loader=ceiling", f"model={model}", "n_workers=0"]
        overrides += [f"max_batches={args.ceiling_batches}", *common]
        m = run_train(scratch, overrides)
        rows.append([model, f"{m['images_per_s']:,.1f}", steady_cell(m, digits=1)])
    return rows


def loader_rows(runs: list[Run]) -> list[list[str]]:
    """The main table's rows, each rate also as a ratio to dataset's under the same settings."""
    baseline = {(r.cache, r.host_only, r.workers): r.rate for r in runs if r.loader == "dataset"}
    rows = []
    for run in runs:
        m, base = run.metrics, baseline.get((run.cache, run.host_only, run.workers))
        rows.append(
            [
                *run.where(),
                f"{run.rate:,.0f}",
                steady_cell(m, "steady_images_per_s_median"),
                f"{run.rate / base:.2f}x" if base else "",
                f"{m['time_to_first_batch_s_median']:.2f}",
                f"{m['data_wait_frac_median']:.2f}",
                f"{m['peak_rss_mb']:,.0f}",
                f"{m['peak_mem_added_mb']:,.0f}",
                f"{m.get('read_mb', float('nan')):,.0f}",
                f"{m.get('cpu_util_mean', float('nan')):.0f}",
                f"{m['order_corr']:.3f}" if "order_corr" in m else "",
                f"{m['cache_resident_frac']:.2f}" if "cache_resident_frac" in m else "",
            ]
        )
    return rows


def stage_table(runs: list[Run]) -> str:
    """Where each image's time went, per run: the workers' stages, and the loop's shares."""
    rows = []
    for run in runs:
        loop = [f"{100 * run.metrics.get(f'stage_{name}_frac', 0.0):.0f}%" for name in MAIN_STAGES]
        rows.append([*run.where(), *stage_cells(run.metrics), *loop])
    return (
        "\nWhere each image's time went (the last epoch of each row): the workers' stages in "
        "us per image, summed over workers; the loop's, as shares of the epoch.\n\n"
        + markdown(["loader", "workers", "host only", "cache", *STAGE_HEADER, *MAIN_STAGES], rows)
    )


def limit_note(runs: list[Run], batch_size: int) -> str:
    """The CPU device's finishing limit, and the share of it each uint8 loader reached."""
    limit = crop_normalize_limit(batch_size)
    text = (
        f"\nLimit on a CPU device: cropping and normalizing uint8 batches already in memory runs "
        f"at {limit:,.0f} images/s here (facebench's own finishing threads, all cores); no loader "
        "that hands over uint8 batches can deliver finished ones faster."
    )
    shares = [
        f"{run.loader} (n_workers {run.workers}, {run.cache}) {100 * run.rate / limit:.0f}%"
        for run in runs
        if run.host_only == "false"
        and loaders.get(run.loader).traits_for().handover == Handover.uint8
    ]
    return text + (f" Share of it reached: {'; '.join(shares)}.\n" if shares else "\n")


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    args = bench.args
    common = [
        f"batch_size={args.batch_size}",
        f"device={args.device}",
        f"data.n_images={args.n_images}",
        *args.extra,
    ]
    with tempfile.TemporaryDirectory() as scratch:
        runs = run_loaders(args, common, scratch)
        ceilings = run_ceilings(args, common, scratch)
    title = (
        f"Loaders, model={args.model}, {args.n_images:,} synthetic images, batch {args.batch_size}"
    )
    details = f"medians of {args.repeat} epochs per row (memory and CPU of the last)"
    body = markdown(HEADER, loader_rows(runs)) + stage_table(runs)
    body += limit_note(runs, args.batch_size)
    if ceilings:
        body += (
            f"\nCompute ceilings (loader=ceiling: one batch on the device, no I/O; "
            f"{args.ceiling_batches} batches of {args.batch_size}):\n\n"
            + markdown(["model", "images/s", "steady images/s"], ceilings)
        )
    bench.publish(f"bench:{args.section}", bench.section(title, details, body))


if __name__ == "__main__":
    main()
