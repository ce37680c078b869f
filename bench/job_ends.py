"""The end of a job, again and again: does every run keep its measurement and leave nothing?

    python bench/job_ends.py                          # 30 raydata jobs cut short, quiet
    python bench/job_ends.py --busy 2                 # the same beside two busy processes
    python bench/job_ends.py --runs 5 -- loader=nodes # another job: overrides after --

Each run is `python train.py` with the overrides (by default `loader=raydata n_workers=2
max_batches=3 batch_size=100 model=resnet18`: an epoch stopped while Ray Data is still decoding
ahead, the case that ended the process at Ray's shutdown), into a temporary MLflow store. A run
passes when it exits 0, its results.json says FINISHED, its MLflow run is FINISHED, and no Ray
process it started is still there 10 s after it exited. Table `job-ends`: the runs that failed
each check, of how many.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import mlflow
from common import Bench, busy_cores, parser, run_python

from facebench.loaders.ray_one_machine import ray_processes
from facebench.report.tables import markdown

DEFAULT = [
    "loader=raydata",
    "n_workers=2",
    "max_batches=3",
    "batch_size=100",
    "model=resnet18",
]
_LEFT_WAIT_S = 10.0
# What Ray's core prints when a thread of the driver calls into it after its shutdown.
_SHUTDOWN_CRASH = "core worker has already been shutdown"


def one_run(scratch: Path, index: int, overrides: list[str]) -> dict[str, bool | float]:
    """One job's end, checked: which checks it passed, and its wall time."""
    before = ray_processes()
    out = scratch / f"run{index}"
    store = f"sqlite:///{scratch / 'mlflow.db'}"
    started = time.monotonic()
    result = run_python(
        ["train.py", *overrides, f"hydra.run.dir={out}"],
        log=scratch / f"run{index}.log",
        check=False,
        env={"MLFLOW_TRACKING_URI": store},
    )
    seconds = time.monotonic() - started
    results = out / "results.json"
    status = json.loads(results.read_text())["status"] if results.is_file() else "none"
    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(
        experiment_names=["facebench"], output_format="list", order_by=["attributes.start_time"]
    )
    deadline = time.monotonic() + _LEFT_WAIT_S
    while (left := ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    output = result.stdout + result.stderr
    return {
        "exit 0": result.returncode == 0,
        "results.json FINISHED": status == "FINISHED",
        "MLflow FINISHED": bool(runs) and runs[-1].info.status == "FINISHED",
        "no Ray process left": not left,
        "no shutdown crash": _SHUTDOWN_CRASH not in output,
        "seconds": seconds,
    }


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--runs", type=int, default=30)
    arguments.add_argument("--busy", type=int, default=0, help="busy processes beside the runs")
    arguments.add_argument("overrides", nargs="*", help=f"train.py's (default: {DEFAULT})")
    bench = Bench.start(arguments)
    overrides = bench.args.overrides or DEFAULT
    checks: list[dict[str, bool | float]] = []
    with busy_cores(bench.args.busy), tempfile.TemporaryDirectory(prefix="job-ends-") as scratch:
        for index in range(bench.args.runs):
            checks.append(one_run(Path(scratch), index, overrides))
            failed = [name for name, ok in checks[-1].items() if ok is False]
            print(f"run {index + 1}: {'ok' if not failed else ', '.join(failed)}", flush=True)
    names = [name for name in checks[0] if name != "seconds"]
    rows = [[name, f"{sum(not run[name] for run in checks)} of {len(checks)}"] for name in names]
    seconds = sorted(float(run["seconds"]) for run in checks)
    details = (
        f"`train.py {' '.join(overrides)}` {len(checks)} times in a row, "
        f"{bench.args.busy} busy processes beside them; each {seconds[0]:.0f}-{seconds[-1]:.0f} s"
    )
    table = markdown(["check", "runs that failed it"], rows)
    name = "job-ends-busy" if bench.args.busy else "job-ends"
    bench.publish(name, bench.section("A job's end, repeated", details, table))


if __name__ == "__main__":
    main()
