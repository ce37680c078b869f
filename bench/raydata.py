"""Ray Data beside the loaders it competes with, and the emulated accelerators it feeds on one
node and on a two-node cluster.

    python bench/raydata.py                  # about 15 minutes on 2 cores
    python bench/raydata.py --rounds 1 --counts 1 2
    python bench/raydata.py --skip cpus --address auto --counts 1 2 4 8   # on a real cluster

Table `raydata-cpus`: the --images synthetic set (20,000), host side (model=none,
host_only=true), warm page cache, batch --batch-size, every loader at the same --workers (2
worker processes, or a local Ray instance of as many CPUs): dataset with the article's PIL
decoding and with decoder=fast, nodes with decoder=fast, raydata (decoder=fast, its default)
and raydata with decoder=pil. --rounds rounds, the loaders alternated within each; the medians.
Memory added is the epoch's peak_mem_added_mb, plus, for raydata, what its Ray processes held
once started (ray_start_mem_mb): they start before the epoch, DataLoader's workers inside it.

Table `raydata-accelerators`: accelerators_per_host over --counts at a `custom` rate of --rate
images/s each (bench/accelerators.py's settings: 4,800 images, batch 40), for nodes
(decoder=fast), raydata on a local instance (one node, --workers CPUs per emulated
accelerator's process) and raydata on a two-node Ray cluster on this machine (`ray start
--head` and `ray start --address`, one CPU each: the same two cores, so it shows what a cluster
costs here, not what more machines bring), or, with --address, a running cluster (set up as
docs/scaling.md says, from the GPU host).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from common import Bench, parser, run_train, sweep_train

from facebench.loaders.ray_one_machine import one_machine_cluster
from facebench.report.tables import markdown

# (row name, overrides): equal CPUs, each loader's decoder named.
CPU_ROWS = [
    ("dataset (pil)", ["loader=dataset"]),
    ("dataset (fast)", ["loader=dataset", "loader.decoder=fast"]),
    ("nodes (fast)", ["loader=nodes", "loader.decoder=fast"]),
    ("raydata (fast)", ["loader=raydata"]),
    ("raydata (pil)", ["loader=raydata", "loader.decoder=pil"]),
]


def start(argv: list[str] | None) -> Bench:
    arguments = parser(__doc__)
    arguments.add_argument("--images", type=int, default=20_000)
    arguments.add_argument("--batch-size", type=int, default=600)
    arguments.add_argument("--workers", type=int, default=2)
    arguments.add_argument("--rounds", type=int, default=3)
    arguments.add_argument("--counts", nargs="+", type=int, default=[1, 2, 4])
    arguments.add_argument("--rate", type=float, default=400.0)
    arguments.add_argument("--skip", nargs="*", default=[], choices=["cpus", "accelerators"])
    arguments.add_argument(
        "--address", default="", help="a running Ray cluster (auto, host:port) to measure instead"
    )
    return Bench.start(arguments, argv)


def cpu_section(bench: Bench, scratch: str) -> str:
    args = bench.args
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in CPU_ROWS}
    for _ in range(args.rounds):
        for name, overrides in CPU_ROWS:
            runs[name].append(
                run_train(
                    scratch,
                    [
                        *overrides,
                        f"n_workers={args.workers}",
                        f"batch_size={args.batch_size}",
                        f"data.n_images={args.images}",
                        "model=none",
                        "host_only=true",
                        "cache=warm",
                    ],
                )
            )
    rows = [[name, *_cpu_cells(runs[name])] for name, _ in CPU_ROWS]
    header = [
        "loader (decoder)",
        "steady images/s",
        "images/s (whole epoch)",
        "first batch s",
        "memory added MB",
        "start-up s (outside the epoch)",
    ]
    title = f"raydata at equal CPUs: {args.workers} workers, host side, {args.images:,} images"
    details = (
        f"batch {args.batch_size}, warm page cache, one epoch per job, {args.rounds} rounds with "
        "the loaders alternated, medians (min-max); MLflow off; nothing else running"
    )
    return bench.section(title, details, markdown(header, rows))


def _cpu_cells(runs: list[dict[str, float]]) -> list[str]:
    def cell(values: list[float], form: str) -> str:
        if not values:
            return "-"
        middle = format(statistics.median(values), form)
        return f"{middle} ({format(min(values), form)}-{format(max(values), form)})"

    memory = [m["peak_mem_added_mb"] + m.get("ray_start_mem_mb", 0.0) for m in runs]
    return [
        cell([m["steady_images_per_s"] for m in runs if "steady_images_per_s" in m], ",.0f"),
        cell([m["images_per_s"] for m in runs], ",.0f"),
        cell([m["time_to_first_batch_s"] for m in runs], ".2f"),
        cell(memory, ",.0f"),
        cell([m["ray_start_s"] for m in runs if "ray_start_s" in m], ".1f"),
    ]


def accelerator_section(bench: Bench, scratch: Path) -> str:
    args = bench.args
    base = [
        f"accelerators_per_host={','.join(map(str, args.counts))}",
        "accelerator=custom",
        f"accelerator.images_per_s={args.rate:g}",
        f"n_workers={args.workers}",
        "data.n_images=4800",
        "batch_size=40",
        "cache=warm",
        "device=cpu",
    ]
    rows = []
    nodes = sweep_train(scratch / "nodes", [*base, "loader=nodes", "loader.decoder=fast"])
    rows.append(["nodes (fast)", f"this host, {args.workers} processes each", *_fed(nodes)])
    local = sweep_train(scratch / "local", [*base, "loader=raydata"])
    one_node = f"one node: a local instance of {args.workers} CPUs each"
    rows.append(["raydata", one_node, *_fed(local)])
    if args.address:  # a real cluster, joined as docs/scaling.md starts one
        joined = sweep_train(
            scratch / "cluster", [*base, "loader=raydata", f"loader.address={args.address}"]
        )
        rows.append(["raydata", f"the Ray cluster at {args.address}", *_fed(joined)])
    else:
        with one_machine_cluster(n_nodes=2, cpus_per_node=1) as cluster:
            joined = sweep_train(
                scratch / "cluster",
                [*base, "loader=raydata", f"loader.address={cluster.address}"],
                env=cluster.env,
            )
        rows.append(["raydata", "a two-node cluster on this host, 1 CPU a node", *_fed(joined)])
    header = [
        "loader",
        "where it decodes",
        *[f"{count} x {args.rate:,.0f}/s: AU, lowest (images/s)" for count in args.counts],
        "fed, each at AU >= 90%",
    ]
    title = f"raydata: emulated accelerators of {args.rate:,.0f} images/s fed, one node and two"
    details = (
        "4,800 images, batch 40, warm page cache, one emulated accelerator per process "
        "(accelerators_per_host), each with its own loader; MLflow off; nothing else running"
    )
    return bench.section(title, details, markdown(header, rows))


def _fed(runs: list[dict]) -> list[str]:
    """Each count's AU (the mean over its accelerators, and the lowest) and images/s, then the
    most accelerators fed: every one of them at AU >= 90%."""
    cells, fed = [], 0
    for run in sorted(runs, key=lambda r: int(r["params"]["accelerators_per_host"])):
        metrics, count = run.get("metrics", {}), int(run["params"]["accelerators_per_host"])
        if run.get("status") != "FINISHED" or "au" not in metrics:
            cells.append(f"{run.get('status', 'failed')}")
            continue
        lowest = metrics.get("au_min", metrics["au"])
        cells.append(f"{metrics['au']:.0%}, lowest {lowest:.0%} ({metrics['images_per_s']:,.0f})")
        if lowest >= 0.9:
            fed = max(fed, count)
    return [*cells, str(fed)]


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    with tempfile.TemporaryDirectory() as scratch:
        if "cpus" not in bench.args.skip:
            bench.publish("bench:raydata-cpus", cpu_section(bench, scratch))
        if "accelerators" not in bench.args.skip:
            bench.publish("bench:raydata-accelerators", accelerator_section(bench, Path(scratch)))


if __name__ == "__main__":
    main()
