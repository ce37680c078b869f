"""Does measuring slow the loop? The same loader-only epochs with each kind of measurement off
and on: stage times, the resource sampler, MLflow's system metrics.

    python bench/sampler_overhead.py --loader dataset
    python bench/sampler_overhead.py --loader raw --repeat 5

Alternates, round after round, train.py jobs (a process each) with everything off
(sample_hz=0, tracking off, stage_times off; only the start/end counters), stage times on, the
sampler at 4 Hz, and the sampler with MLflow's system metrics (a temporary store), so drift in
the machine hits all alike; prints the median steady and whole-epoch images/s of each, and
writes the table into docs/benchmarks.md (one section per loader and mode).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from common import Bench, parser, run_train

from facebench import stages
from facebench.loaders.shared import Batch
from facebench.measure.timeline import LoopTimeline
from facebench.report.tables import markdown

OFF = ["sample_hz=0", "tracking=false", "stage_times=false"]
SETTINGS = {
    "everything off": OFF,
    "stage times on": ["sample_hz=0", "tracking=false", "stage_times=true"],
    "sampler 4 Hz": ["sample_hz=4", "tracking=false", "stage_times=false"],
    "sampler 4 Hz + MLflow system metrics 1 Hz": [
        "sample_hz=4",
        "tracking=true",
        "stage_times=false",
    ],
}


def _median(metrics: dict[str, float], name: str) -> float:
    return metrics.get(f"{name}_median", metrics[name])


def timing_cost(n: int = 200_000) -> tuple[float, float]:
    """What stage timing itself costs, measured directly: per image, the clock readings a
    decoding loader's stage makes (loaders/decoding.py: read, then decode and transform); per
    batch, its take and the loop's timeline (a batch received through the timed wrapper, and
    the loop's marks). In microseconds."""
    stages.begin_epoch(True)
    start = time.perf_counter()
    for _ in range(n):
        stages.lap(stages.READ, stages.now())
        stages.lap(stages.TRANSFORM, stages.lap(stages.DECODE, stages.now()))
    per_image = (time.perf_counter() - start) / n * 1e6

    def batches():
        for _ in range(n // 10):
            yield Batch(None, None, None, stages=stages.take())

    timeline = LoopTimeline(stages.StageTotals(), time.perf_counter())
    start = time.perf_counter()
    for _ in timeline.measured(batches()):
        timeline.arrived("handover")
        timeline.mark("handover")
        timeline.mark("finish")
        timeline.mark("step")
    per_batch = (time.perf_counter() - start) / (n // 10) * 1e6
    return per_image, per_batch


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    arguments.add_argument("--n-images", type=int, default=20_000)
    arguments.add_argument("--rounds", type=int, default=5)
    arguments.add_argument("--loader", default="dataset")
    arguments.add_argument("--n-workers", type=int, default=2)
    arguments.add_argument("--host-only", action="store_true", help="host_only=true")
    arguments.add_argument(
        "--repeat", type=int, default=1, help="epochs per job, medians taken (short epochs)"
    )
    arguments.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    return Bench.start(arguments, argv)


def measure(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each setting once a round, every run a train.py job: steady and whole-epoch images/s
    (medians over the job's epochs) of each, by setting."""
    steady: dict[str, list[float]] = {name: [] for name in SETTINGS}
    whole: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as scratch:
        # Where a setting turns MLflow on, it records into a store that goes with the runs.
        store = {"MLFLOW_TRACKING_URI": f"sqlite:///{scratch}/mlflow.db"}
        for round_index in range(args.rounds):
            for name, overrides in SETTINGS.items():
                print(f"round {round_index + 1}: {name}", file=sys.stderr, flush=True)
                metrics = run_train(
                    scratch,
                    [
                        f"loader={args.loader}",
                        "model=none",
                        f"n_workers={args.n_workers}",
                        "cache=warm",
                        f"host_only={str(args.host_only).lower()}",
                        f"repeat={args.repeat}",
                        f"data.n_images={args.n_images}",
                        *overrides,
                        *args.extra,
                    ],
                    env=store,
                )
                steady[name].append(_median(metrics, "steady_images_per_s"))
                whole[name].append(_median(metrics, "images_per_s"))
    return steady, whole


def overhead_rows(steady: dict[str, list[float]], whole: dict[str, list[float]]) -> list[list[str]]:
    """Each setting's median rates, and how far each is from everything off."""
    base = statistics.median(steady["everything off"])
    base_whole = statistics.median(whole["everything off"])
    return [
        [
            name,
            f"{statistics.median(values):,.0f}",
            f"{min(values):,.0f}-{max(values):,.0f}",
            f"{100 * (statistics.median(values) / base - 1):+.1f}%",
            f"{statistics.median(whole[name]):,.0f}",
            f"{100 * (statistics.median(whole[name]) / base_whole - 1):+.1f}%",
        ]
        for name, values in steady.items()
    ]


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    args = bench.args
    mode = "host only" if args.host_only else "loader-only"
    steady, whole = measure(args)
    repeats = f", {args.repeat} epochs a job (their medians)" if args.repeat > 1 else ""
    title = f"Measurement overhead, loader={args.loader}, {mode}, n_workers {args.n_workers}, warm"
    details = (
        f"{args.rounds} rounds{repeats}, {args.n_images:,} synthetic images, the settings "
        "alternated within each round; nothing else ran on the machine meanwhile"
    )
    header = ["measurement", "steady images/s (median)", "range", "vs off"]
    header += ["whole-epoch images/s", "vs off"]
    per_image, per_batch = timing_cost()
    body = markdown(header, overhead_rows(steady, whole)) + (
        f"\nStage timing's own cost, measured directly in this process: {per_image:.2f} us per "
        f"image (three timed stages) and {per_batch:.1f} us per batch (its take, and the "
        "loop's timeline).\n"
    )
    suffix = f"-{args.loader}" + ("-host" if args.host_only else "")
    bench.publish(f"bench:sampler-overhead{suffix}", bench.section(title, details, body))


if __name__ == "__main__":
    main()
