"""How many emulated accelerators this host feeds, per loader: MLPerf Storage's headline figure.

    python bench/accelerators.py                     # about an hour on 2 cores
    python bench/accelerators.py --loaders raw dataset --rate 500 --counts 1 2 4
    python bench/accelerators.py --host-cpu 1        # only what a GPU run's host pays (default)

For every loader and n_workers 1 and 2, two sweeps of `train.py -m` (MLPerf Storage's way:
one process per emulated accelerator, torchrun's launcher): accelerators_per_host over --counts
at a `custom` rate of --rate images/s each (chosen so the knee falls inside the counts on this
host), and one `a100` and one `h100` (MLPerf Storage's ResNet-50 rates scaled to the crop). Warm
page cache, MLflow off. A loader's shards are built by its first job, before its clock starts.
Writes one table into docs/benchmarks.md (--no-write to skip).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common import Bench, parser, sweep_train

from facebench import loaders
from facebench.report import hosts_fed
from facebench.report.tables import markdown

LOADERS = loaders.names(real_only=True)  # the registry's, never written out


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    arguments.add_argument("--loaders", nargs="+", default=LOADERS)
    arguments.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    arguments.add_argument("--counts", nargs="+", type=int, default=[1, 2, 4, 8])
    arguments.add_argument("--rate", type=float, default=400.0)
    arguments.add_argument("--images", type=int, default=4800)
    arguments.add_argument("--batch-size", type=int, default=40)
    arguments.add_argument("--host-cpu", nargs="+", type=float, default=[0.0, 1.0])
    return Bench.start(arguments, argv)


def common_overrides(bench: Bench, loader: str) -> list[str]:
    args = bench.args
    return [
        f"loader={loader}",
        f"n_workers={','.join(map(str, args.workers))}",
        f"data.n_images={args.images}",
        f"batch_size={args.batch_size}",
        f"accelerator.host_cpu={','.join(f'{share:g}' for share in args.host_cpu)}",
        "cache=warm",
        "device=cpu",
    ]


def with_host_cpu(runs: list[Mapping[str, Any]], share: float) -> list[Mapping[str, Any]]:
    """The runs whose loop spun `share` of a core while it waited for each step."""
    return [
        run for run in runs if float(run.get("params", {}).get("accelerator.host_cpu", -1)) == share
    ]


def fed(runs: list[Mapping[str, Any]], workers: int) -> str:
    """'4 (AU 93%); 8: AU 61%, decode': the most accelerators fed, and what the next count got."""
    tried = hosts_fed.grouped(runs)
    mine = [tries for (_, w, _), tries in tried.items() if w == str(workers)]
    if not mine:
        return "failed"
    tries = mine[0]
    passed = [t for t in tries if t.passed]
    most = max(passed, key=lambda t: t.accelerators) if passed else None
    cell = f"{most.accelerators} (AU {most.au:.0%})" if most else "0"
    above = [t for t in tries if t.accelerators > (most.accelerators if most else 0)]
    if above:
        nxt = min(above, key=lambda t: t.accelerators)
        cell += f"; {nxt.accelerators}: AU {nxt.au:.0%}, {nxt.dominant_stage or '-'}"
    return cell


def au_of(runs: list[Mapping[str, Any]], workers: int, accelerator: str) -> str:
    for run in runs:
        params, metrics = run.get("params", {}), run.get("metrics", {})
        if (
            str(params.get("n_workers")) == str(workers)
            and params.get("accelerator.name") == accelerator
            and "au" in metrics
        ):
            return f"{metrics['au']:.0%} ({metrics['images_per_s']:,.0f}/s)"
    return "failed"


def loader_rows(bench: Bench, loader: str, scratch: Path) -> list[list[str]]:
    args = bench.args
    base = common_overrides(bench, loader)
    counts = sweep_train(
        scratch / loader / "counts",
        [
            *base,
            "accelerator=custom",
            f"accelerator.images_per_s={args.rate:g}",
            f"accelerators_per_host={','.join(map(str, args.counts))}",
        ],
    )
    published = sweep_train(scratch / loader / "published", [*base, "accelerator=a100,h100"])
    return [
        [
            loader,
            str(workers),
            f"{share:g}",
            fed(with_host_cpu(counts, share), workers),
            au_of(with_host_cpu(published, share), workers, "a100"),
            au_of(with_host_cpu(published, share), workers, "h100"),
        ]
        for workers in args.workers
        for share in args.host_cpu
    ]


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    args = bench.args
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for loader in args.loaders:
            rows += loader_rows(bench, loader, Path(scratch))
    header = [
        "loader",
        "n_workers",
        "host_cpu",
        f"accelerators of {args.rate:,.0f} images/s fed at AU >= 90%; the next count",
        "one a100: AU (images/s)",
        "one h100: AU (images/s)",
    ]
    title = "How many accelerators this host feeds: every loader, emulated accelerators"
    details = (
        f"synthetic set of {args.images:,} images, batch {args.batch_size}, crop 100, warm page "
        f"cache, accelerators_per_host {', '.join(map(str, args.counts))} at a custom "
        f"{args.rate:,.0f} images/s each; a100 4,614 and h100 8,960 images/s (MLPerf Storage's "
        "224x224 rates scaled by pixel count); accelerator.host_cpu "
        f"{', '.join(f'{share:g}' for share in args.host_cpu)}; one epoch per run, MLflow off"
    )
    body = markdown(header, rows) + (
        "\nThe next count's stage is the one that cost its workers most CPU time per image "
        "(`dominant_stage`; `-` where a loader's stages are not broken down). AU is rounded: "
        "a next count shown at 90% fell short by less than half a percent.\n"
    )
    bench.publish("bench:accelerators", bench.section(title, details, body))


if __name__ == "__main__":
    main()
