"""DALI's CPU backend against loader=dataset: its threads and prefetch queue tuned, side by side.

    python bench/dali_tuning.py                    # 20,000 synthetic images, CPU device, warm

loader=dataset (n_workers = the cores) and loader=dali at each --threads x --prefetch (DALI's
num_threads and prefetch_queue_depth: facebench's n_workers and loader.prefetch_factor) run in
turn, every run its own `python train.py` process, --rounds times, on the same files, loader-only
on the CPU device (DALI decodes and resizes; facebench's finishing threads crop and normalize).
Each DALI setting is given as its median over the rounds, and as a ratio to the median of
dataset's runs. Prints a Markdown table and writes it into docs/benchmarks.md (--no-write to skip).
"""

from __future__ import annotations

import itertools
import statistics
import tempfile

from common import Bench, parser, run_train

from facebench.host.resources import usable_cores
from facebench.report.tables import markdown


def main(argv: list[str] | None = None) -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--n-images", type=int, default=20_000)
    arguments.add_argument("--threads", nargs="+", type=int, default=[2, 3, 4])
    arguments.add_argument("--prefetch", nargs="+", type=int, default=[2, 3])
    arguments.add_argument("--rounds", type=int, default=2)
    bench = Bench.start(arguments, argv)
    args = bench.args
    common = ["model=none", "cache=warm", "repeat=2", f"data.n_images={args.n_images}"]
    settings = {"dataset": ["loader=dataset", f"n_workers={usable_cores()}"]}
    for threads, prefetch in itertools.product(args.threads, args.prefetch):
        settings[f"dali, {threads} threads, queue {prefetch}"] = [
            "loader=dali",
            f"n_workers={threads}",
            f"loader.prefetch_factor={prefetch}",
        ]
    rates: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.rounds):
            for name, overrides in settings.items():
                metrics = run_train(scratch, [*overrides, *common])
                rates[name].append(metrics["steady_images_per_s_median"])
    base = statistics.median(rates["dataset"])
    rows = [
        [
            name,
            ", ".join(f"{rate:,.0f}" for rate in runs),
            f"{statistics.median(runs):,.0f}",
            f"{statistics.median(runs) / base:.2f}x",
        ]
        for name, runs in rates.items()
    ]
    best = max(
        (name for name in rates if name != "dataset"), key=lambda n: statistics.median(rates[n])
    )
    title = (
        f"DALI's CPU backend tuned, against dataset, {args.n_images:,} synthetic images, "
        "CPU device, warm"
    )
    details = (
        f"{args.rounds} rounds, each setting once a round, 2 epochs a run (steady images/s, "
        "median of the two); nothing else ran meanwhile"
    )
    body = (
        markdown(["setting", "steady images/s, each round", "median", "vs dataset"], rows)
        + f"\nFastest: {best} ({statistics.median(rates[best]) / base:.2f}x dataset).\n"
    )
    bench.publish("bench:dali-tuning", bench.section(title, details, body))


if __name__ == "__main__":
    main()
