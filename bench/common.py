"""The harness every benchmark script runs in, and what their tables share.

A script builds its arguments on `parser` (which adds the ones every script takes), starts with
`Bench.start` (its arguments, the command line and the machine's load before the first run),
runs train.py with `run_train` or `sweep_train` (other scripts of the checkout with
`run_python`), builds each section with `Bench.section` (title, then the header: date, machine,
command line, load) and hands it to `Bench.publish`, which prints it and writes it into
docs/benchmarks.md unless --no-write. Tables: facebench.report.tables.markdown, as facebench
renders its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from facebench.data.synthetic import synthetic_root
from facebench.host.device import cpu_model
from facebench.host.paths import PROJECT_ROOT, cache_dir
from facebench.report.sweep_summary import sweep_results
from facebench.stages import BUILT_IN_STAGES

BENCHMARKS_MD = PROJECT_ROOT / "docs" / "benchmarks.md"


def parser(description: str) -> argparse.ArgumentParser:
    """A benchmark's argument parser: its module docstring as the help, laid out as written, and
    the arguments every benchmark takes (--no-write)."""
    arguments = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    arguments.add_argument(
        "--no-write", action="store_true", help="print only: write nothing into docs/benchmarks.md"
    )
    return arguments


@dataclass(frozen=True)
class Bench:
    """One run of a benchmark script: its arguments, how it was invoked, and the machine's load
    before its first run (the runs themselves load it, so this is taken at the start)."""

    args: argparse.Namespace
    command: str
    load: str

    @classmethod
    def start(cls, parser: argparse.ArgumentParser, argv: list[str] | None = None) -> Bench:
        """The arguments parsed; the command line and the load noted before anything runs."""
        return cls(parser.parse_args(argv), command_line(argv), load_note())

    def section(self, title: str, details: str, body: str) -> str:
        """A docs/benchmarks.md section: its title, the header (when, on what machine, how
        invoked, the script's details of the runs, the load as they began), then the body."""
        header = f"{stamp()}; {machine()}. `{self.command}`; {details}; {self.load}."
        return f"### {title}\n\n{header}\n\n{body}"

    def publish(self, name: str, text: str, path: Path = BENCHMARKS_MD) -> None:
        """Print a section, and put it between its markers (`<!-- name:start -->`) in the docs
        file, unless --no-write."""
        print(text)
        if not self.args.no_write:
            write_section(name, text, path)


def command_line(argv: list[str] | None) -> str:
    """How the running script was invoked: its own file name (sys.argv[0]), then its arguments."""
    arguments = " ".join(argv if argv is not None else sys.argv[1:])
    return f"python bench/{Path(sys.argv[0]).name} {arguments}".rstrip()


def run_python(
    arguments: list[str],
    log: Path | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python <arguments>` (a script of the checkout, or `-m module`) in a process of its own,
    from the checkout's root, with the checkout first on PYTHONPATH (a GPU machine may have
    facebench's dependencies but not facebench installed) and `env` added to the environment;
    its output kept in `log` if given. If it fails and `check`, the benchmark ends with the end
    of its output."""
    path = [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(path)}
    command = [sys.executable, *arguments]
    print("$ python", " ".join(arguments), file=sys.stderr, flush=True)
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True, check=False
    )
    if log is not None:
        log.write_text(result.stdout + result.stderr, encoding="utf-8")
    if check and result.returncode != 0:
        raise SystemExit(
            f"failed: {' '.join(command)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result


def run_train(
    scratch: str, overrides: list[str], env: Mapping[str, str] | None = None
) -> dict[str, float]:
    """One `python train.py` job, in a folder of its own under `scratch`, with `env` added to its
    environment, MLflow off unless the overrides turn it on (the later value wins); its metrics,
    from its results.json."""
    output = Path(tempfile.mkdtemp(dir=scratch))
    run_python(["train.py", "tracking=false", *overrides, f"hydra.run.dir={output}"], env=env)
    return json.loads((output / "results.json").read_text())["metrics"]


def sweep_train(
    folder: Path, overrides: list[str], env: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """One `python train.py -m` sweep into `folder` (its output in folder/sweep.log), MLflow off,
    with `env` added to its environment: every job's whole results.json (params, status,
    metrics), in job order. A failed job does not stop the sweep; the caller sees which jobs are
    missing or did not finish."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep = ["train.py", "-m", "tracking=false", *overrides, f"hydra.sweep.dir={folder}"]
    run_python(sweep, log=folder / "sweep.log", check=False, env=env)
    return sweep_results(folder)


@contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """`n` processes that spin while the block runs: another job beside a run, on a shared host."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def generated_root(n_images: int) -> Path:
    """The synthetic set of this many images (seed 0) that the runs just made generated."""
    root = synthetic_root(cache_dir(""), n_images, seed=0)
    if not root.is_dir():
        raise SystemExit(f"{root}: no synthetic set of {n_images:,} images; run train.py first")
    return root


def machine() -> str:
    """This machine in one line, for a section's header: CPU, cores, memory, GPUs, versions."""
    cpu = cpu_model()
    gpu = gpus() if torch.cuda.is_available() else "no GPU"
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB RAM, {gpu}; "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def gpus() -> str:
    """'1 x NVIDIA H200 (driver 570.x, CUDA 13.0)'."""
    count = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    driver = "driver unknown"
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = f"driver {pynvml.nvmlSystemGetDriverVersion()}"
    except Exception:  # no NVML library here: the driver goes unnamed
        pass
    return f"{count} x {name} ({driver}, CUDA {torch.version.cuda})"


def load_note() -> str:
    """The machine's load as measurements start: another job sharing the cores moves ratios."""
    try:
        one_minute = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return "load average unknown"
    return f"1-minute load average {one_minute:.2f} as the runs began"


def stamp() -> str:
    """Now, to the minute, in UTC."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


# Where each image's time went (facebench/stages.py): the workers' CPU time in each stage, the
# time they waited inside the stages (for a core or storage), and their whole CPU time (the
# stages' share of it: the rest is start-up, the loader's bookkeeping, handing batches over).
STAGE_HEADER = [*(f"{name} CPU us" for name in BUILT_IN_STAGES), "waited us", "worker CPU us"]


def stage_cells(metrics: dict[str, float]) -> list[str]:
    """A run's STAGE_HEADER cells; "-" where its loader's stages are not broken down."""
    if "stage_worker_us" not in metrics:
        return ["-"] * len(STAGE_HEADER)
    cells = [f"{metrics.get(f'stage_{name}_cpu_us', 0.0):,.0f}" for name in BUILT_IN_STAGES]
    cells.append(f"{metrics.get('stage_waited_us', 0.0):,.0f}")
    cells.append(f"{metrics.get('stage_worker_cpu_us', 0.0):,.0f}")
    return cells


def steady_cell(
    metrics: dict[str, float], key: str = "steady_images_per_s", digits: int = 0
) -> str:
    """A steady rate's cell; "-" where the run had too few batches after its warm-up for one."""
    value = metrics.get(key)
    return "-" if value is None else f"{value:,.{digits}f}"


def write_section(name: str, text: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the section between this benchmark's markers in docs/benchmarks.md."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}"
    current = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _: block, current)
    else:
        updated = current.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(updated, encoding="utf-8")
