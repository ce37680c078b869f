"""Every number facebench promises about a GPU, from one command, in about eight minutes.

    python bench/gpu_check.py                 # on a machine with a CUDA GPU
    python bench/gpu_check.py --dry-run       # the same steps on this CPU, at a tiny size

Steps: the gpu-marked tests; a synthetic set of --n-images (100,000 by default) and every shard
format built for it (one prepare.py sweep); then every loader with n_workers=--workers, three
ways, in two Hydra sweeps (one process each, MLflow off): loader-only stopping at the hand-over
(host_only=true) and loader-only with the copy and finishing on the GPU; then with ResNet-50
under AMP, beside the compute ceiling (loader=ceiling, ResNet-50). Prints a table (images/s,
steady images/s, gpu_busy_frac, gpu_util_mean, data_wait_frac, first batch) and writes it into
docs/benchmarks.md with the date, GPU, CPU cores and versions (--no-write to skip). Loaders
whose library is not installed (dali, litdata) are skipped, and the table says so.

It runs from a checkout with the packages the machine has (torch, torchvision, numpy, pillow,
psutil, nvidia-ml-py, tqdm) and wheels for the rest (hydra-core, omegaconf, antlr4, torchdata,
webdataset, braceexpand): see the README's "Checking on a GPU machine".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, stamp, steady_cell, table, write_section

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Each mode's name and the (model, host_only) its jobs ran with.
MODES = {
    "host only": ("none", True),
    "loader only, GPU finishes": ("none", False),
    "ResNet-50 AMP": ("resnet50", False),
}
# On a CPU a ResNet-50 step takes seconds: a dry run checks the steps with one step of the
# smaller ResNet-18 (the same code path), in fp32 (bf16 may be emulated there).
_DRY_MODEL = ["model=resnet18", "amp=off", "max_batches=1"]
_REQUIRED = ["hydra", "omegaconf", "torchdata", "webdataset", "torch", "torchvision", "psutil"]


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def known_loaders() -> list[str]:
    """The loaders this checkout has (its registry), less those whose library is not
    installed here. Imported late: the check of the required packages comes first."""
    from facebench import loaders

    return [name for name in loaders.names(real_only=True) if loaders.get(name).available()]


def known_formats() -> list[str]:
    """The shard formats, less those whose library is not installed here."""
    from facebench.shards import formats

    return [
        name
        for name in formats.names()
        if formats.get(name).requires is None or formats.get(name).requires.available()
    ]


def run(command: list[str], env: dict[str, str], log: Path) -> subprocess.CompletedProcess:
    print("$", " ".join(command), file=sys.stderr, flush=True)
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False
    )
    log.write_text(result.stdout + result.stderr, encoding="utf-8")
    return result


def sweep(
    loaders: list[str], mode: list[str], common: list[str], out: Path, env: dict[str, str]
) -> dict[tuple[str, bool, str], dict]:
    """One `train.py -m` over the loaders (and whatever `mode` sweeps too); each job's
    results.json, by (loader, host_only, model), the model counted as "resnet50" for all."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "train.py",
        "-m",
        f"loader={','.join(loaders)}",
        *mode,
        *common,
        "tracking=false",
        f"hydra.sweep.dir={out}",
    ]
    run(command, env, out / "sweep.log")
    found = {}
    for path in out.glob("*/results.json"):
        job = json.loads(path.read_text())
        params = job["params"]
        model = "none" if params["model"] == "none" else "resnet50"
        found[(params["loader"], bool(params["host_only"]), model)] = job
    return found


def row(mode: str, loader: str, job: dict | None) -> list[str]:
    if job is None or job.get("status") != "FINISHED":
        status = "did not run" if job is None else job.get("status", "?")
        return [mode, loader, status, "", "", "", "", "", ""]
    m = job["metrics"]

    def number(name: str, digits: int = 2) -> str:
        return f"{m[name]:,.{digits}f}" if name in m else "n/a"

    return [
        mode,
        loader,
        f"{m['images_per_s']:,.0f}",
        steady_cell(m),
        number("gpu_busy_frac"),
        number("gpu_util_mean", 0),
        number("data_wait_frac"),
        number("time_to_first_batch_s"),
        f"{m['epoch_time_s']:,.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the steps")
    parser.add_argument("--n-images", type=int, help="synthetic set size (100,000; dry run 240)")
    parser.add_argument("--workers", type=int, help="n_workers for every loader (16; dry run 2)")
    parser.add_argument("--batch-size", type=int, help="600; dry run 16")
    parser.add_argument("--out", type=Path, help="docs file to write (docs/benchmarks.md)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--cache-dir", type=Path, help="where the synthetic set goes (.cache)")
    args = parser.parse_args(argv)
    dry = args.dry_run
    n_images = args.n_images or (240 if dry else 100_000)
    workers = args.workers if args.workers is not None else (2 if dry else 16)
    batch_size = args.batch_size or (16 if dry else 600)
    missing = [name for name in _REQUIRED if not available(name)]
    if missing:
        print(
            f"missing Python packages: {', '.join(missing)}. Install the wheels as the README's "
            '"Checking on a GPU machine" says, then run again.',
            file=sys.stderr,
        )
        return 2
    import torch

    if not dry and not torch.cuda.is_available():
        print("no CUDA device here; use --dry-run to check the steps on a CPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    env = dict(
        os.environ, PYTHONPATH=f"{PROJECT_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    cache = args.cache_dir or (scratch / "cache" if dry else PROJECT_ROOT / ".cache")
    device = "cpu" if dry else "cuda"
    common = [
        f"data.cache_dir={cache}",
        f"data.n_images={n_images}",
        f"n_workers={workers}",
        f"batch_size={batch_size}",
        f"device={device}",
        "resource_check=false" if dry else "resource_check=true",
    ]
    lines = []
    if not args.skip_tests:
        tests = run(
            [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"], env, scratch / "tests.log"
        )
        summary = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
        lines.append(f"gpu-marked tests: {summary}")
    formats = ",".join(known_formats())
    prepare = [
        sys.executable,
        "prepare.py",
        "-m",
        f"format={formats}",
        f"data.cache_dir={cache}",
        f"data.n_images={n_images}",
        f"n_workers={os.cpu_count() or 1}",
        f"hydra.sweep.dir={scratch / 'prepare'}",
    ]
    if run(prepare, env, scratch / "prepare.log").returncode != 0:
        lines.append(f"prepare.py -m format={formats} failed: see {scratch / 'prepare.log'}")
    from facebench import loaders as registry

    loaders = known_loaders()
    skipped = [name for name in registry.names(real_only=True) if name not in loaders]
    host = ["model=none", "host_only=true,false"]
    jobs = sweep(loaders, host, common, scratch / "loader-only", env)
    model = _DRY_MODEL if dry else ["model=resnet50", "amp=auto"]
    jobs |= sweep([*loaders, "ceiling"], model, common, scratch / "resnet50", env)
    rows = [
        row(mode, loader, jobs.get((loader, host_only, model_name)))
        for mode, (model_name, host_only) in MODES.items()
        for loader in loaders
    ]
    rows.append(row("compute ceiling", "ceiling", jobs.get(("ceiling", False, "resnet50"))))
    header = [
        "mode",
        "loader",
        "images/s",
        "steady images/s",
        "gpu_busy_frac",
        "gpu_util_mean %",
        "data_wait_frac",
        "first batch s",
        "epoch s",
    ]
    title = "GPU check (dry run on a CPU: steps only, numbers mean nothing)" if dry else "GPU check"
    text = (
        f"### {title}: {n_images:,} synthetic images, batch {batch_size}, "
        f"n_workers {workers}\n\n{stamp()}; {machine()}. `python bench/gpu_check.py"
        f"{' --dry-run' if dry else ''}`, {time.perf_counter() - started:,.0f} s in all.\n\n"
        + "\n".join(f"- {line}" for line in lines)
        + ("\n" if lines else "")
        + (f"- not installed here, skipped: {', '.join(skipped)}\n" if skipped else "")
        + "\n"
        + table(header, rows)
    )
    print(text)
    if not args.no_write:
        section = "bench:gpu-check-dry-run" if dry else "bench:gpu-check"
        write_section(section, text, **({"path": args.out} if args.out else {}))
    print(f"logs in {scratch}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
