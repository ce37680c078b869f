"""Does measuring slow the loop? The same loader-only epochs with the samplers off and on.

    python bench/sampler_overhead.py

Alternates runs with sample_hz=0 and tracking off (only start/end counters), sample_hz=4, and
sample_hz=4 with MLflow's system metrics (a temporary store), so drift in the machine hits all
three alike, and prints median images/s of each. Writes the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile

from common import config, machine, stamp, table, write_section

from facebench.runner import run_training

SETTINGS = {
    "samplers off": ["sample_hz=0", "tracking=false"],
    "sampler 4 Hz": ["sample_hz=4", "tracking=false"],
    "sampler 4 Hz + MLflow system metrics 1 Hz": ["sample_hz=4", "tracking=true"],
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-images", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loader", default="dataset")
    parser.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as store:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}/mlflow.db"
        rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for round_index in range(args.rounds):
            for name, overrides in SETTINGS.items():
                print(f"round {round_index + 1}: {name}", file=sys.stderr, flush=True)
                metrics = run_training(
                    config(
                        f"loader={args.loader}",
                        "model=none",
                        "n_workers=2",
                        "cache=warm",
                        f"data.n_images={args.n_images}",
                        *overrides,
                        *args.extra,
                    )
                )
                rates[name].append(metrics["images_per_s"])
    base = statistics.median(rates["samplers off"])
    rows = [
        [
            name,
            f"{statistics.median(values):,.0f}",
            f"{min(values):,.0f}-{max(values):,.0f}",
            f"{100 * (statistics.median(values) / base - 1):+.1f}%",
        ]
        for name, values in rates.items()
    ]
    text = (
        f"### Sampler overhead, loader={args.loader}, loader-only, n_workers 2, warm\n\n"
        f"{stamp()}; {machine()}. `python bench/sampler_overhead.py`; {args.rounds} rounds, "
        f"{args.n_images:,} synthetic images.\n\n"
        + table(["measurement", "median images/s", "range", "vs off"], rows)
    )
    print(text)
    if not args.no_write:
        write_section("bench:sampler-overhead", text)


if __name__ == "__main__":
    main()
