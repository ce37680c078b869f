"""Every number facebench promises about a GPU, from one command, in about eight minutes.

    python bench/gpu_check.py                 # on a machine with a CUDA GPU
    python bench/gpu_check.py --dry-run       # the same steps on this CPU, at a tiny size

Steps: the gpu-marked tests; a synthetic set of --n-images (100,000 by default) and every shard
format built for it (one prepare.py sweep); then every loader with n_workers=--workers, three
ways, in two Hydra sweeps (one process each, MLflow off): loader-only stopping at the hand-over
(host_only=true) and loader-only with the copy and finishing on the GPU; then with ResNet-50
under AMP, beside the compute ceiling (loader=ceiling, ResNet-50), run again with CUDA's
blocking sync to measure the host CPU a step costs both ways, which it also writes as an
accelerator profile, conf/accelerator/measured-<gpu>.yaml (facebench/profile.py), that any machine
can emulate; last, a user's loop on a folder set with ResNet-18 under AMP, its loader
watched (bench/watched_loop.py). Prints a table (images/s,
steady images/s, gpu_busy_frac, gpu_util_mean, data_wait_frac, first batch) and writes it into
docs/benchmarks.md with the date, GPU, CPU cores and versions (--no-write to skip). Loaders
whose library is not installed (dali, litdata) are skipped, and the table says so.

It runs from a checkout with the packages the machine has (torch, torchvision, numpy, pillow,
psutil, nvidia-ml-py, tqdm) and wheels for the rest (hydra-core, omegaconf, antlr4, torchdata,
webdataset, braceexpand): see the README's "Checking on a GPU machine".
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import BENCHMARKS_MD, Bench, parser, run_python, steady_cell, sweep_train
from watched_loop import checked

from facebench.host.paths import PROJECT_ROOT
from facebench.report.tables import markdown

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


def jobs_by_key(jobs: list[dict[str, Any]]) -> dict[tuple[str, bool, str], dict[str, Any]]:
    """A sweep's jobs by (loader, host_only, model), the model counted as "resnet50" for all
    (the dry run's smaller model stands in for it)."""
    found = {}
    for job in jobs:
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


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    arguments.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny sizes: checks the steps"
    )
    arguments.add_argument("--n-images", type=int, help="synthetic set size (100,000; dry run 240)")
    arguments.add_argument("--workers", type=int, help="n_workers for every loader (16; dry run 2)")
    arguments.add_argument("--batch-size", type=int, help="600; dry run 16")
    arguments.add_argument("--out", type=Path, help="docs file to write (docs/benchmarks.md)")
    arguments.add_argument("--skip-tests", action="store_true")
    arguments.add_argument("--cache-dir", type=Path, help="where the synthetic set goes (.cache)")
    arguments.add_argument(
        "--loaders", nargs="+", help="the loaders to run (default: every one installed here)"
    )
    bench = Bench.start(arguments, argv)
    args, dry = bench.args, bench.args.dry_run
    # The sizes a run was not given: the full check's, or the dry run's tiny ones.
    args.n_images = args.n_images or (240 if dry else 100_000)
    args.workers = args.workers if args.workers is not None else (2 if dry else 16)
    args.batch_size = args.batch_size or (16 if dry else 600)
    return bench


def not_ready(dry: bool) -> str | None:
    """Why the check cannot run here (a sentence), or None."""
    missing = [name for name in _REQUIRED if not available(name)]
    if missing:
        return (
            f"missing Python packages: {', '.join(missing)}. Install the wheels as the README's "
            '"Checking on a GPU machine" says, then run again.'
        )
    import torch

    if not dry and not torch.cuda.is_available():
        return "no CUDA device here; use --dry-run to check the steps on a CPU"
    return None


def run_tests(scratch: Path) -> str:
    """The gpu-marked tests, summed up in their last line."""
    tests = ["-m", "pytest", "-q", "-m", "gpu", "tests"]
    result = run_python(tests, log=scratch / "tests.log", check=False)
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    return f"gpu-marked tests: {summary}"


def build_shards(cache: Path, n_images: int, scratch: Path) -> str | None:
    """Every shard format (whose library is here) built for the set: a line if that failed."""
    formats = ",".join(known_formats())
    prepare = [
        "prepare.py",
        "-m",
        f"format={formats}",
        f"data.cache_dir={cache}",
        f"data.n_images={n_images}",
        f"n_workers={os.cpu_count() or 1}",
        f"hydra.sweep.dir={scratch / 'prepare'}",
    ]
    if run_python(prepare, log=scratch / "prepare.log", check=False).returncode != 0:
        return f"prepare.py -m format={formats} failed: see {scratch / 'prepare.log'}"
    return None


def run_jobs(
    loaders: list[str], common: list[str], dry: bool, scratch: Path
) -> dict[tuple[str, bool, str], dict[str, Any]]:
    """Two sweeps: every loader loader-only, host_only true and false; then every loader and
    the compute ceiling with the model. Their jobs by (loader, host_only, model)."""
    host = ["model=none", "host_only=true,false"]
    jobs = sweep_train(scratch / "loader-only", [f"loader={','.join(loaders)}", *host, *common])
    model = _DRY_MODEL if dry else ["model=resnet50", "amp=auto"]
    everything = f"loader={','.join([*loaders, 'ceiling'])}"
    jobs += sweep_train(scratch / "resnet50", [everything, *model, *common])
    return jobs_by_key(jobs)


def host_cpu_line(
    default: dict[str, Any] | None, model: list[str], common: list[str], scratch: Path
) -> str:
    """The host CPU a training step costs (the ceiling's loop_cpu_cores: its process's CPU time
    over the epoch's), under CUDA's default scheduling (the sweep's ceiling) and once more with
    blocking sync (CUDA's wait then sleeps): an emulated accelerator's host_cpu."""
    from facebench.host.device import CUDA_SCHEDULE_ENV

    blocking = sweep_train(
        scratch / "ceiling-blocking-sync",
        ["loader=ceiling", *model, *common],
        env={CUDA_SCHEDULE_ENV: "blocking_sync"},
    )
    cores = [
        f"{job['metrics']['loop_cpu_cores']:.2f}"
        if job and job.get("status") == "FINISHED" and "loop_cpu_cores" in job["metrics"]
        else "not measured"
        for job in (default, blocking[0] if blocking else None)
    ]
    return (
        f"host CPU of a training step (the ceiling's loop_cpu_cores, accelerator.host_cpu): "
        f"{cores[0]} cores with CUDA's default scheduling, {cores[1]} with blocking sync"
    )


def check_table(loaders: list[str], jobs: dict[tuple[str, bool, str], dict[str, Any]]) -> str:
    """One row per mode and loader, then the compute ceiling's."""
    rows = [
        row(mode, loader, jobs.get((loader, host_only, model_name)))
        for mode, (model_name, host_only) in MODES.items()
        for loader in loaders
    ]
    rows.append(row("compute ceiling", "ceiling", jobs.get(("ceiling", False, "resnet50"))))
    header = ["mode", "loader", "images/s", "steady images/s", "gpu_busy_frac"]
    header += ["gpu_util_mean %", "data_wait_frac", "first batch s", "epoch s"]
    return markdown(header, rows)


def write_gpu_profile(ceiling: dict[str, Any] | None, folder: Path | None) -> str:
    """The compute ceiling as an accelerator profile (in conf/accelerator/, or `folder` for a
    dry run, whose numbers mean nothing); what was written, in a line."""
    from facebench.profile import PROFILES, write_profile
    from facebench.results import JobResults

    if ceiling is None or ceiling.get("status") != "FINISHED":
        return "no accelerator profile: the compute ceiling did not finish"
    results = JobResults(**{k: ceiling[k] for k in ("run_name", "params", "tags", "metrics")})
    gpu = str(results.tags.get("gpu", "none"))
    name = "measured-" + "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-")
    path = write_profile(name, results, folder or PROFILES)
    return f"accelerator profile written: {path} (use it with accelerator={name})"


def main(argv: list[str] | None = None) -> int:
    bench = start(argv)
    args, dry = bench.args, bench.args.dry_run
    problem = not_ready(dry)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    cache = args.cache_dir or (scratch / "cache" if dry else PROJECT_ROOT / ".cache")
    common = [
        f"data.cache_dir={cache}",
        f"data.n_images={args.n_images}",
        f"n_workers={args.workers}",
        f"batch_size={args.batch_size}",
        f"device={'cpu' if dry else 'cuda'}",
        f"resource_check={'false' if dry else 'true'}",
    ]
    lines = [] if args.skip_tests else [run_tests(scratch)]
    failed = build_shards(cache, args.n_images, scratch)
    lines += [failed] if failed else []
    from facebench import loaders as registry

    installed = known_loaders()
    loaders = [name for name in installed if name in (args.loaders or installed)]
    skipped = [name for name in registry.names(real_only=True) if name not in installed]
    lines += [f"not installed here, skipped: {', '.join(skipped)}"] if skipped else []
    unknown = [name for name in args.loaders or [] if name not in installed]
    lines += [f"--loaders named what is not here: {', '.join(unknown)}"] if unknown else []
    jobs = run_jobs(loaders, common, dry, scratch)
    ceiling = jobs.get(("ceiling", False, "resnet50"))
    if not dry:  # CUDA's scheduling flags: nothing to set on a CPU
        model = ["model=resnet50", "amp=auto"]
        lines += [host_cpu_line(ceiling, model, common, scratch)]
    lines += [write_gpu_profile(ceiling, scratch if dry else None)]
    lines += [checked(Path(cache), args.n_images, args.workers, args.batch_size, dry, scratch)]
    title = "GPU check (dry run on a CPU: steps only, numbers mean nothing)" if dry else "GPU check"
    title += (
        f": {args.n_images:,} synthetic images, batch {args.batch_size}, n_workers {args.workers}"
    )
    details = f"{time.perf_counter() - started:,.0f} s in all"
    body = "".join(f"- {line}\n" for line in lines) + ("\n" if lines else "")
    body += check_table(loaders, jobs)
    section = "bench:gpu-check-dry-run" if dry else "bench:gpu-check"
    bench.publish(section, bench.section(title, details, body), args.out or BENCHMARKS_MD)
    print(f"logs in {scratch}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
