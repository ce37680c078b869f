"""An accelerator profile from a real GPU's compute ceiling, for any machine to emulate it.

    python train.py loader=ceiling                      # on the GPU: ResNet-50 AMP, no I/O
    python -m facebench.profile outputs/<date>/<time> --name h200
    python train.py accelerator=h200 loader=raw         # anywhere: is raw fast enough for it?

Reads the ceiling job's results.json (its steady rate, the crop it trained at, the GPU's name)
and writes conf/accelerator/<name>.yaml: measured, not scaled, at that crop. bench/gpu_check.py
writes one the same way for the GPU it runs on.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from facebench.errors import FacebenchError
from facebench.host.paths import PROJECT_ROOT
from facebench.results import RESULTS, JobResults

log = logging.getLogger("facebench.profile")

PROFILES = PROJECT_ROOT / "conf" / "accelerator"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def profile_text(name: str, results: JobResults) -> str:
    """A profile's YAML from a ceiling run's results (refused unless it is one)."""
    params, metrics, tags = results.params, results.metrics, results.tags
    if params.get("loader") != "ceiling" or params.get("accelerator.name", "none") != "none":
        raise FacebenchError(
            f"run {results.run_name}: not a compute ceiling on a real device; make one with "
            "python train.py loader=ceiling (on the GPU to profile)"
        )
    rate = metrics.get("steady_images_per_s") or metrics.get("images_per_s")
    if not rate:
        raise FacebenchError(f"run {results.run_name} measured no rate; run it again")
    if "steady_images_per_s" not in metrics:
        # A profile asks for the device's steady pace; a short run has none (measure/meter.py), and
        # its whole epoch, start-up included, understates the device. (meter imports torch:
        # only here, where it is needed.)
        from facebench.measure.meter import batches_for_steady

        in_flight = int(params.get("n_workers", 0)) * int(params.get("loader.prefetch_factor", 2))
        log.info(
            "run %s has no steady rate (%d batches, too few after its warm-up): the profile "
            "takes its whole epoch's rate, start-up included, below the device's steady pace. "
            "A ceiling run of %d batches or more gives a steady one (a larger data.n_images or "
            "a smaller batch_size)",
            results.run_name,
            metrics.get("batches", 0),
            batches_for_steady(in_flight),
        )
    # A ceiling run under torchrun sums its ranks' rates: a profile is one accelerator's.
    gpus = int(metrics.get("world_size", 1))
    rate /= gpus
    crop = int(params.get("transform.crop", 100))
    gpu = tags.get("gpu", "none")
    device = gpu if gpu != "none" else tags.get("device_name", "an unnamed device")
    source = (
        f"measured: {results.run_name} on {device} ({params.get('model')}, "
        f"{params.get('amp_resolved')}, batch {params.get('batch_size')}, {crop}x{crop}"
        f"{f', one of {gpus} ranks' if gpus > 1 else ''})"
    )
    return (
        f"# {name}: an accelerator profile measured by facebench (python -m facebench.profile).\n"
        f"# {source}.\n"
        f"name: {name}\n"
        f"images_per_s: {rate:.1f}\n"
        f"measured_at: {crop}\n"
        f'source: "{source}"\n'
        f"{host_cpu_lines(results)}"
    )


def host_cpu_lines(results: JobResults) -> str:
    """The profile's host_cpu: the cores the ceiling's training process kept busy (its CPU
    time over the epoch's; at most one: the key is a share of one core), or nothing where the
    run did not measure it (the schema's default, unmeasured, then stands)."""
    used = results.metrics.get("loop_cpu_cores")
    if used is None:
        return ""
    share = min(1.0, used)
    capped = f", capped at 1 from {used:.2f}" if used > 1 else ""
    device = results.tags.get("gpu", "none")
    source = (
        f"measured: the training process's CPU time over the epoch's in {results.run_name} on "
        f"{device if device != 'none' else 'a CPU'}{capped} (facebench's loop, which reads "
        "nothing back per step, under CUDA's default scheduling)"
    )
    return f'host_cpu: {share:.2f}\nhost_cpu_source: "{source}"\n'


def write_profile(name: str, results: JobResults, folder: Path = PROFILES) -> Path:
    if not _NAME.match(name) or name in ("none", "custom"):
        raise FacebenchError(
            f"--name {name}: use lower-case letters, digits, - and _ (not none or custom)"
        )
    path = folder / f"{name}.yaml"
    path.write_text(profile_text(name, results), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m facebench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("job", type=Path, help="the loader=ceiling job's output folder")
    parser.add_argument("--name", required=True, help="the profile's name: accelerator=<name>")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = write_profile(args.name, JobResults.read(args.job / RESULTS))
    except FacebenchError as error:
        log.error("%s", error)
        sys.exit(1)
    log.info("wrote %s: use it with accelerator=%s", path, args.name)


if __name__ == "__main__":
    main()
