"""The article's two open questions, answered from stage times.

    python bench/article_questions.py            # both; writes two sections of docs/benchmarks.md

(a) Why did pickle shards win by 4-13x in the article, and by far less here? The article's three
    pipelines (and raw) with a warm page cache, a cold one on this machine's disk, and a cold
    one on slower storage (the disk throttled to HDD-like IOPS and bandwidth with the block I/O
    controller, where the machine allows it): each loader's rate and where each image's time
    went, stage by stage.
(b) Why did 5 and 10 workers disagree in opposite directions for Dataset and DataPipes? Each at
    5 and 10 workers, in both run orders, the first run of each pair after a cold start and the
    second with cache=keep (what the first left in the page cache), on slower storage; and both
    with a warm cache for reference. Memory added per run shows what 10 workers' listings and
    shuffle buffers cost.

Every run is a train.py process of its own (MLflow off), loader-only (model=none): on a CPU the
model would set the pace. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import tempfile

from common import STAGE_HEADER, Bench, parser, run_train, stage_cells
from slow_storage import SlowStorage

from facebench.host.paths import cache_dir
from facebench.report.tables import markdown

PIPELINES = ("dataset", "datapipe", "pickle", "raw")


class Runs:
    """train.py runs with shared settings, some of them on throttled storage."""

    def __init__(self, args: argparse.Namespace, scratch: str, slow: SlowStorage | str) -> None:
        self.args = args
        self.scratch = scratch
        self.slow = slow

    def run(self, loader: str, workers: int, cache: str, slow: bool = False) -> dict[str, float]:
        overrides = [
            f"loader={loader}",
            f"n_workers={workers}",
            f"cache={cache}",
            "model=none",
            f"data.n_images={self.args.n_images}",
            f"batch_size={self.args.batch_size}",
            f"shard_size={self.args.shard_size}",
        ]
        if slow and isinstance(self.slow, SlowStorage):
            with self.slow.applied():
                return run_train(self.scratch, overrides)
        return run_train(self.scratch, overrides)


def why_pickle(runs: Runs) -> str:
    conditions = [("warm page cache", "warm", False), ("cold, this disk", "cold", False)]
    if isinstance(runs.slow, SlowStorage):
        conditions.append(("cold, slow storage", "cold", True))
    rows = []
    for label, cache, slow in conditions:
        measured = {name: runs.run(name, runs.args.workers, cache, slow) for name in PIPELINES}
        base = measured["dataset"]["images_per_s"]
        for name, metrics in measured.items():
            rows.append(
                [
                    label,
                    name,
                    f"{metrics['images_per_s']:,.0f}",
                    f"{metrics['images_per_s'] / base:.2f}x",
                    *stage_cells(metrics),
                    f"{metrics.get('read_mb', 0.0):,.0f}",
                ]
            )
    header = ["storage", "loader", "images/s", "vs dataset", *STAGE_HEADER, "read from disk MB"]
    return markdown(header, rows)


def workers_5_10(runs: Runs) -> str:
    rows = []
    slow = isinstance(runs.slow, SlowStorage)
    for loader in ("dataset", "datapipe"):
        for first, second in ((5, 10), (10, 5)):
            for position, (workers, cache) in enumerate(((first, "cold"), (second, "keep"))):
                metrics = runs.run(loader, workers, cache, slow)
                order = f"{first} then {second}"
                rows.append(_row(loader, order, position + 1, cache, workers, metrics))
        for workers in (5, 10):
            metrics = runs.run(loader, workers, "warm")
            rows.append(_row(loader, "warm", 1, "warm", workers, metrics))
    header = [
        "loader",
        "order",
        "run",
        "cache",
        "workers",
        "images/s",
        "cached before",
        *STAGE_HEADER,
        "memory added MB",
    ]
    return markdown(header, rows)


def _row(
    loader: str, order: str, position: int, cache: str, workers: int, metrics: dict[str, float]
) -> list[str]:
    return [
        loader,
        order,
        str(position),
        cache,
        str(workers),
        f"{metrics['images_per_s']:,.0f}",
        f"{metrics.get('cache_resident_frac', 0.0):.2f}",
        *stage_cells(metrics),
        f"{metrics.get('peak_mem_added_mb', 0.0):,.0f}",
    ]


def main(argv: list[str] | None = None) -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--n-images", type=int, default=6000)
    arguments.add_argument("--batch-size", type=int, default=600)
    arguments.add_argument("--shard-size", type=int, default=1000, help="shards for every worker")
    arguments.add_argument("--workers", type=int, default=2, help="n_workers for question (a)")
    arguments.add_argument("--iops", type=int, default=150, help="slow storage: reads per second")
    arguments.add_argument("--mbps", type=int, default=120, help="slow storage: MB/s")
    arguments.add_argument("--only", choices=("a", "b"), help="one question")
    bench = Bench.start(arguments, argv)
    args = bench.args
    slow = SlowStorage.open(cache_dir(""), args.iops, args.mbps * 10**6)
    storage = slow.describe() if isinstance(slow, SlowStorage) else f"not emulated: {slow}"
    details = (
        f"{args.n_images:,} synthetic images, batch {args.batch_size}, loader-only "
        f"(model=none), shard_size {args.shard_size}; slow storage: {storage}. Each row one "
        "train.py process; nothing else ran meanwhile"
    )
    with tempfile.TemporaryDirectory() as scratch:
        runs = Runs(args, scratch, slow)
        if args.only in (None, "a"):
            title = "Why pickle shards won: stages per storage"
            bench.publish("bench:why-pickle", bench.section(title, details, why_pickle(runs)))
        if args.only in (None, "b"):
            title = "5 and 10 workers, run order and page cache"
            bench.publish("bench:workers-5-10", bench.section(title, details, workers_5_10(runs)))


if __name__ == "__main__":
    main()
