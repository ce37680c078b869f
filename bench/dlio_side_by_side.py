"""facebench's emulated accelerators beside MLPerf Storage's DLIO benchmark, on the same files.

    python bench/dlio_side_by_side.py --dlio ~/dlio-venv/bin/dlio_benchmark   # about 5 minutes

DLIO generates a set of PNG files (grey, --size x --size pixels, random noise, as its
`png` format makes them); facebench reads the same files (`data=folder`, a labels CSV written
next to them, every label 0). Both then run one epoch with the same computation time per batch,
batch size and reader threads (DLIO's `read_threads`, facebench's `n_workers`, `loader=dataset`
for both being PyTorch DataLoaders), for each accelerator count (DLIO: `mpirun -np N`, one MPI
rank per accelerator; facebench: `accelerators_per_host=N`, torchrun's launcher), and the table
holds both tools' AU and samples/s. What each reader does per sample differs, and the section
says how: DLIO's PNG reader decodes each file (PIL) and hands the step a pre-made array;
facebench decodes, crops or resizes to 100x100, normalizes and collates, as training would.

DLIO pins versions facebench's environment does not (tensorflow, an older torch, mpi4py,
nvidia-dali-cuda110, which does not install without CUDA), so it lives in a virtual environment
of its own, and needs MPI (Debian: openmpi-bin, libopenmpi-dev). How it was installed here:
docs/benchmarks.md, the section this script writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Bench, parser, run_train

from facebench.report.tables import markdown


def start(argv: list[str] | None) -> Bench:
    """This script's arguments, parsed, and the run begun."""
    arguments = parser(__doc__)
    arguments.add_argument(
        "--dlio",
        default=shutil.which("dlio_benchmark") or str(Path.home() / "dlio-venv/bin/dlio_benchmark"),
        help="the dlio_benchmark command (in its own virtual environment)",
    )
    arguments.add_argument("--files", type=int, default=2400)
    arguments.add_argument("--size", type=int, default=112, help="each image's side in pixels")
    arguments.add_argument("--batch-size", type=int, default=40)
    arguments.add_argument("--threads", type=int, default=1)
    arguments.add_argument(
        "--computation-time",
        nargs="+",
        type=float,
        default=[0.1, 0.02],
        help="seconds per batch: one both tools should feed, one they should not",
    )
    arguments.add_argument("--counts", nargs="+", type=int, default=[1, 2])
    return Bench.start(arguments, argv)


class DlioFailed(Exception):
    """DLIO did not run: the command, and the end of what it printed."""

    def __init__(self, what: str, output: str) -> None:
        super().__init__(what)
        self.output = output


def dlio(bench: Bench, data: Path, out: Path, ranks: int, *settings: str) -> dict:
    """One `mpirun -np <ranks> dlio_benchmark` run with these settings; its summary.json."""
    args = bench.args
    command = [
        "mpirun",
        *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
        "-np",
        str(ranks),
        args.dlio,
        "workload=default",
        "++workload.framework=pytorch",
        "++workload.reader.data_loader=pytorch",
        "++workload.dataset.format=png",
        f"++workload.dataset.data_folder={data}",
        f"++workload.dataset.num_files_train={args.files}",
        "++workload.dataset.num_files_eval=0",
        "++workload.dataset.num_subfolders_train=0",
        "++workload.dataset.num_subfolders_eval=0",
        # DLIO makes PNGs of sqrt(record_length) pixels a side.
        f"++workload.dataset.record_length={args.size * args.size}",
        "++workload.workflow.evaluation=False",
        f"++workload.reader.batch_size={args.batch_size}",
        f"++workload.reader.read_threads={args.threads}",
        "++workload.train.epochs=1",
        *settings,
        f"hydra.run.dir={out}",
    ]
    print("$", " ".join(command), file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    (out.parent / f"{out.name}.log").write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode != 0:
        raise DlioFailed(f"`{' '.join(command)}` exited with {result.returncode}", result.stderr)
    summary = out / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else {}


def generate(bench: Bench, data: Path, scratch: Path) -> None:
    """DLIO's own PNG set in data/train, and the labels CSV facebench reads it with."""
    dlio(
        bench,
        data,
        scratch / "generate",
        1,
        "++workload.workflow.generate_data=True",
        "++workload.workflow.train=False",
    )
    files = sorted((data / "train").glob("*.png"))
    if len(files) != bench.args.files:
        made = f"{data / 'train'}: DLIO made {len(files)} files, not {bench.args.files}"
        raise DlioFailed(made, "")
    rows = "".join(f"train/{path.name},0\n" for path in files)
    (data / "labels.csv").write_text(rows, encoding="utf-8")


def dlio_cells(bench: Bench, data: Path, scratch: Path, ranks: int, step_s: float) -> list[str]:
    summary = dlio(
        bench,
        data,
        scratch / f"dlio-{ranks}-{step_s:g}",
        ranks,
        "++workload.workflow.generate_data=False",
        "++workload.workflow.train=True",
        f"++workload.train.computation_time={step_s}",
    )
    metric = summary.get("metric", {})
    return [
        f"{metric['train_au_mean_percentage'] / 100:.0%}",
        f"{metric['train_throughput_mean_samples_per_second']:,.0f}",
    ]


def facebench_cells(bench: Bench, data: Path, scratch: Path, ranks: int, step_s: float) -> list:
    args = bench.args
    metrics = run_train(
        str(scratch),
        [
            "data=folder",
            f"data.root={data}",
            "data.labels=labels.csv",
            "loader=dataset",
            f"n_workers={args.threads}",
            f"batch_size={args.batch_size}",
            "accelerator=custom",
            f"accelerator.step_s={step_s}",
            f"accelerator.step_batch={args.batch_size}",
            f"accelerators_per_host={ranks}",
            "device=cpu",
            "cache=warm",
        ],
    )
    return [f"{metrics['au']:.0%}", f"{metrics['images_per_s']:,.0f}"]


def side_by_side(bench: Bench) -> list[list[str]]:
    """Both tools on DLIO's files, each computation time and accelerator count: the rows."""
    args = bench.args
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        data = scratch / "data"
        generate(bench, data, scratch)
        for step_s in args.computation_time:
            rate = args.batch_size / step_s
            for ranks in args.counts:
                cells = [f"{step_s:g} ({rate:,.0f} images/s)", str(ranks)]
                cells += dlio_cells(bench, data, scratch, ranks, step_s)
                cells += facebench_cells(bench, data, scratch, ranks, step_s)
                rows.append(cells)
    return rows


def main(argv: list[str] | None = None) -> None:
    bench = start(argv)
    args = bench.args
    title = "Beside MLPerf Storage's DLIO: the same files, computation time, batch and threads"
    if not Path(args.dlio).is_file() and not shutil.which(args.dlio):
        raise SystemExit(
            f"--dlio {args.dlio}: no such command. Install DLIO in a virtual environment of its "
            "own (docs/benchmarks.md, 'Beside MLPerf Storage's DLIO') and name it with --dlio"
        )
    try:
        rows = side_by_side(bench)
    except DlioFailed as failed:
        # The table says why there is none, with DLIO's own words.
        body = f"DLIO could not run here: {failed}.\n\n```\n{failed.output[-2000:]}\n```\n"
        bench.publish("bench:dlio", bench.section(title, "no table", body))
        raise SystemExit(1) from failed
    header = [
        "computation time s/batch (rate)",
        "accelerators",
        "DLIO AU",
        "DLIO samples/s",
        "facebench AU",
        "facebench images/s",
    ]
    details = (
        f"{args.files:,} PNG files that DLIO generated ({args.size}x{args.size}, grey noise), "
        f"batch {args.batch_size}, {args.threads} reader thread(s) per accelerator (DLIO "
        "read_threads, facebench n_workers with loader=dataset), one epoch, page cache warm "
        "for both (DLIO's run reads the files facebench's run has just read, and the reverse)"
    )
    body = markdown(header, rows) + WHY.format(version=dlio_version(args.dlio))
    bench.publish("bench:dlio", bench.section(title, details, body))


# What differs between the two columns, and how DLIO was installed here.
WHY = """
Per sample, DLIO {version}'s PNG reader opens and decodes the file (PIL, `np.asarray`) and then
hands the step a pre-made random array of `record_length` bytes: no crop, resize, normalize or
conversion to a tensor. facebench's `loader=dataset` does what training needs: decodes, converts
grey to RGB, resizes to 100x100, normalizes and collates float tensors. Both samples/s count
the whole epoch, the first step included (DLIO's throughput: steps x batch over the epoch's
time, summed over ranks); both AUs leave the first step out. Which tool feeds more depends on
each reader's cost per sample, not on how the two count.

DLIO was installed in a virtual environment of its own (its requirements pin tensorflow, an
older torch and nvidia-dali-cuda110, which has no wheel without CUDA; its PyTorch PNG reader
needs neither DALI nor torchvision):

```bash
sudo apt-get install -y openmpi-bin libopenmpi-dev
python3.11 -m venv ~/dlio-venv
~/dlio-venv/bin/pip install --no-deps dlio_benchmark==2.0.0
~/dlio-venv/bin/pip install torch tensorflow mpi4py pydftracer==1.0.2 hydra-core omegaconf \\
    h5py pandas psutil Pillow PyYAML numpy
python bench/dlio_side_by_side.py --dlio ~/dlio-venv/bin/dlio_benchmark
```
"""


def dlio_version(command: str) -> str:
    """The dlio_benchmark package's version, asked of the Python beside the command."""
    python = Path(shutil.which(command) or command).parent / "python"
    asked = "import importlib.metadata as m; print(m.version('dlio_benchmark'))"
    result = subprocess.run([str(python), "-c", asked], capture_output=True, text=True)
    return result.stdout.strip() or "(version unknown)"


if __name__ == "__main__":
    main()
