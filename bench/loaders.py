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

from common import (
    STAGE_HEADER,
    command_line,
    load_note,
    machine,
    run_train,
    stage_cells,
    stamp,
    steady_cell,
    table,
    write_section,
)

from facebench import loaders
from facebench.loaders.spec import Handover
from facebench.stages import MAIN_STAGES

LOADERS = loaders.names(real_only=True)  # the registry's, never written out


def crop_normalize_limit(batch_size: int, seconds: float = 3.0) -> float:
    """Images/s at which this machine crops and normalizes uint8 batches already in memory.

    The same code as a CPU device's runs (facebench.finish: threads ahead of the loop, one per
    core), on one batch handed over again and again. Whatever a loader does before, a CPU device
    still needs this step, so no loader that hands over uint8 batches can beat it there.
    """
    import itertools
    import time

    import numpy as np
    import torch

    from facebench.data.batch_transforms import crop_offsets
    from facebench.finish import finished_ahead_on_cpu
    from facebench.loaders.shared import Batch
    from facebench.resources import usable_cores

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-images", type=int, default=20_000)
    parser.add_argument("--loaders", nargs="+", default=LOADERS)
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--caches", nargs="+", default=["warm", "cold"])
    parser.add_argument(
        "--host-only",
        nargs="+",
        default=["false"],
        choices=["false", "true"],
        help="true: stop where a GPU run hands the batch to the device (host_only=true)",
    )
    parser.add_argument("--batch-size", type=int, default=600)
    parser.add_argument("--model", default="none")
    parser.add_argument("--ceiling-models", nargs="*", default=["resnet18", "resnet50"])
    parser.add_argument("--ceiling-batches", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--section", default="loaders")
    parser.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    common = [
        f"batch_size={args.batch_size}",
        f"device={args.device}",
        f"data.n_images={args.n_images}",
        *args.extra,
    ]
    load = load_note()
    rows, baseline, rates, stage_rows = [], {}, [], []
    with tempfile.TemporaryDirectory() as scratch:
        for cache, host_only, workers in itertools.product(
            args.caches, args.host_only, args.workers
        ):
            for loader in args.loaders:
                m = run_train(
                    scratch,
                    [
                        f"loader={loader}",
                        f"n_workers={workers}",
                        f"cache={cache}",
                        f"model={args.model}",
                        f"repeat={args.repeat}",
                        f"host_only={host_only}",
                        *common,
                    ],
                )
                rate = m["images_per_s_median"]
                loop = [f"{100 * m.get(f'stage_{name}_frac', 0.0):.0f}%" for name in MAIN_STAGES]
                where = [loader, str(workers), "yes" if host_only == "true" else "no", cache]
                stage_rows.append([*where, *stage_cells(m), *loop])
                rates.append((loader, workers, host_only, cache, rate))
                if loader == "dataset":
                    baseline[(cache, host_only, workers)] = rate
                rows.append(
                    [
                        loader,
                        str(workers),
                        "yes" if host_only == "true" else "no",
                        cache,
                        f"{rate:,.0f}",
                        steady_cell(m, "steady_images_per_s_median"),
                        "",  # vs dataset: filled in once every loader has run
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
        for row, (_, workers, host_only, cache, rate) in zip(rows, rates, strict=True):
            base = baseline.get((cache, host_only, workers))
            row[6] = f"{rate / base:.2f}x" if base else ""
        ceilings = [
            [model, f"{m['images_per_s']:,.1f}", steady_cell(m, digits=1)]
            for model in args.ceiling_models
            for m in [
                run_train(
                    scratch,
                    [
                        "loader=ceiling",
                        f"model={model}",
                        "n_workers=0",
                        f"max_batches={args.ceiling_batches}",
                        *common,
                    ],
                )
            ]
        ]
    header = [
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
    text = (
        f"### Loaders, model={args.model}, {args.n_images:,} synthetic images, "
        f"batch {args.batch_size}\n\n"
        f"{stamp()}; {machine()}. `{command_line('loaders.py', argv)}`; "
        f"medians of {args.repeat} epochs per row (memory and CPU of the last); {load}.\n\n"
        + table(header, rows)
    )
    text += (
        "\nWhere each image's time went (the last epoch of each row): the workers' stages in "
        "us per image, summed over workers; the loop's, as shares of the epoch.\n\n"
        + table(
            ["loader", "workers", "host only", "cache", *STAGE_HEADER, *MAIN_STAGES], stage_rows
        )
    )
    limit = crop_normalize_limit(args.batch_size)
    text += (
        f"\nLimit on a CPU device: cropping and normalizing uint8 batches already in memory runs "
        f"at {limit:,.0f} images/s here (facebench's own finishing threads, all cores); no loader "
        "that hands over uint8 batches can deliver finished ones faster."
    )
    shares = [
        f"{loader} (n_workers {workers}, {cache}) {100 * rate / limit:.0f}%"
        for loader, workers, host_only, cache, rate in rates
        if host_only == "false" and loaders.get(loader).traits_for().handover == Handover.uint8
    ]
    text += f" Share of it reached: {'; '.join(shares)}.\n" if shares else "\n"
    if ceilings:
        text += (
            f"\nCompute ceilings (loader=ceiling: one batch on the device, no I/O; "
            f"{args.ceiling_batches} batches of {args.batch_size}):\n\n"
            + table(["model", "images/s", "steady images/s"], ceilings)
        )
    print(text)
    if not args.no_write:
        write_section(f"bench:{args.section}", text)


if __name__ == "__main__":
    main()
