"""What `watch(loader)` costs a training loop: the same loop timed with and without it.

    python bench/watch_cost.py                      # 6,000 images, 2 workers, 9 rounds
    python bench/watch_cost.py --rounds 9 --no-write

The loop is a user's: the generated folder set (`python -m facebench.generate --layout folder`)
in an ImageFolder with bench/shopdata.py's v2 augmentations, a DataLoader (batch 64, shuffled),
and a small CNN's training step on the CPU. Each round runs one epoch bare and one watched
(tracking off: results.json only), the first of the two alternating, so that the machine's drift
falls on both; an epoch's time is the loop's wall time, from asking for the first batch to the
end of the last step, watch's own closing lines and results.json included, and its CPU time
(the process and its workers: on two cores, the steadier of the two). Prints each round's
ratios and their medians, and writes the table into docs/benchmarks.md (--no-write to skip).
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import Bench, parser, run_python
from torch import nn
from torch.utils.data import DataLoader

from facebench import watch
from facebench.host.paths import PROJECT_ROOT
from facebench.report.tables import markdown

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
from shopdata import shop_images  # noqa: E402  (the documented example, as a user's module)


def small_model(n_classes: int) -> nn.Module:
    """A step of a few milliseconds a batch: the loop is the loader's, as watch's cost is."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, n_classes),
    )


def one_epoch(
    loader: DataLoader, model: nn.Module, watched: bool, folder: Path
) -> tuple[float, float]:
    """The loop's wall time, and the CPU time of this process and its workers (which end with
    the epoch), in seconds."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = watch(loader, tracking=False, folder=folder) if watched else loader
    cpu_start, start = _cpu_s(), time.perf_counter()
    for images, labels in batches:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    wall = time.perf_counter() - start
    return wall, _cpu_s() - cpu_start


def _cpu_s() -> float:
    """CPU time of this process and of its children that have ended (the epoch's workers)."""
    own, ended = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def main(argv: list[str] | None = None) -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--rounds", type=int, default=9)
    arguments.add_argument("--n-workers", type=int, default=2)
    arguments.add_argument("--n-images", type=int, default=6000)
    bench = Bench.start(arguments, argv)
    args = bench.args
    made = run_python(["-m", "facebench.generate", "--layout", "folder", "--n-images",
                       str(args.n_images)])  # fmt: skip
    dataset = shop_images(made.stdout.strip(), 112)
    loader = DataLoader(
        dataset, batch_size=64, shuffle=True, num_workers=args.n_workers, drop_last=True
    )
    model = small_model(len(dataset.classes))
    one_epoch(loader, model, False, Path())  # warm: the page cache, the allocator
    rows, walls, cpus = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            times = {kind: one_epoch(loader, model, kind, Path(scratch)) for kind in order}
            (bare, bare_cpu), (watched, watched_cpu) = times[False], times[True]
            walls.append(watched / bare)
            cpus.append(watched_cpu / bare_cpu)
            rows.append(
                [str(round_ + 1), f"{bare:.2f}", f"{watched:.2f}", f"{walls[-1]:.3f}"]
                + [f"{bare_cpu:.2f}", f"{watched_cpu:.2f}", f"{cpus[-1]:.3f}"]
            )
    median, median_cpu = statistics.median(walls), statistics.median(cpus)
    rows.append(["median", "", "", f"{median:.3f}", "", "", f"{median_cpu:.3f}"])
    header = ["round", "bare loop s", "watched loop s", "watched / bare"]
    header += ["bare CPU s", "watched CPU s", "CPU watched / bare"]
    table = markdown(header, rows)
    details = (
        f"{args.n_images:,} images (generated folder set) in an ImageFolder with "
        f"bench/shopdata.py's v2 augmentations at 112 px, {args.n_workers} workers, batch 64, "
        f"a small CNN's step on the CPU; {args.rounds} rounds, each one epoch bare and one "
        "watched, their order alternating; nothing else ran"
    )
    verdict = (
        f"watch changed the loop's time by {100 * (median - 1):+.1f}% and its CPU time (the "
        f"process and its workers) by {100 * (median_cpu - 1):+.1f}% (medians of "
        f"{args.rounds} rounds)."
    )
    bench.publish(
        "watch-cost", bench.section("What watch costs a loop", details, f"{table}\n\n{verdict}\n")
    )


if __name__ == "__main__":
    main()
