"""What the benchmark scripts share: composing configs, describing the machine, writing docs."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import torch
from hydra import compose, initialize_config_dir

from facebench.config import typed
from facebench.data.synthetic import synthetic_root
from facebench.device import cpu_model
from facebench.entry import configure
from facebench.paths import PROJECT_ROOT, cache_dir
from facebench.stages import WORKER_STAGES
from facebench.tables import markdown

BENCHMARKS_MD = PROJECT_ROOT / "docs" / "benchmarks.md"
_configured = False


def run_train(scratch: str, overrides: list[str]) -> dict[str, float]:
    """One `python train.py` job in its own process, MLflow off; its metrics from results.json."""
    output = Path(tempfile.mkdtemp(dir=scratch))
    command = [
        sys.executable,
        str(PROJECT_ROOT / "train.py"),
        *overrides,
        "tracking=false",
        f"hydra.run.dir={output}",
    ]
    print("running", " ".join(overrides), file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(
            f"failed: {' '.join(command)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return json.loads((output / "results.json").read_text())["metrics"]


def config(*overrides: str) -> Any:
    """train.yaml composed and checked exactly as train.py would, with these overrides: the
    typed config run_training takes."""
    global _configured
    if not _configured:
        configure()
        _configured = True
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return typed(compose(config_name="train", overrides=list(overrides)))


def generated_root(n_images: int) -> Path:
    """The synthetic set of this many images (seed 0) that the runs just made generated."""
    root = synthetic_root(cache_dir(""), n_images, seed=0)
    if not root.is_dir():
        raise SystemExit(f"{root}: no synthetic set of {n_images:,} images; run train.py first")
    return root


def machine() -> str:
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


def command_line(script: str, argv: list[str] | None) -> str:
    """How this benchmark was invoked, for its section's header."""
    arguments = " ".join(argv if argv is not None else sys.argv[1:])
    return f"python bench/{script} {arguments}".rstrip()


def stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


# Where each image's time went (facebench/stages.py): the workers' CPU time in each stage, the
# time they waited inside the stages (for a core or storage), and their whole CPU time (the
# stages' share of it: the rest is start-up, the loader's bookkeeping, handing batches over).
STAGE_HEADER = [*(f"{name} CPU us" for name in WORKER_STAGES), "waited us", "worker CPU us"]


def stage_cells(metrics: dict[str, float]) -> list[str]:
    """A run's STAGE_HEADER cells; "-" where its loader's stages are not broken down."""
    if "stage_worker_us" not in metrics:
        return ["-"] * len(STAGE_HEADER)
    cells = [f"{metrics.get(f'stage_{name}_cpu_us', 0.0):,.0f}" for name in WORKER_STAGES]
    cells.append(f"{metrics.get('stage_waited_us', 0.0):,.0f}")
    cells.append(f"{metrics.get('stage_worker_cpu_us', 0.0):,.0f}")
    return cells


def steady_cell(
    metrics: dict[str, float], key: str = "steady_images_per_s", digits: int = 0
) -> str:
    """A steady rate's cell; "-" where the run had too few batches after its warm-up for one."""
    value = metrics.get(key)
    return "-" if value is None else f"{value:,.{digits}f}"


table = markdown  # every table of docs/benchmarks.md, as facebench renders its own


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
