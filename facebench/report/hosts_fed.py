"""How many emulated accelerators one host feeds: MLPerf Storage's headline figure, from a sweep
over accelerators_per_host (`train.py -m accelerator=h100 accelerators_per_host=1,2,4,8`).

Per loader, n_workers and accelerator: the most accelerators per host whose runs kept the
accelerators at or above accelerator.min_au (au_pass), and, for the next count tried, its AU and
the stage that cost its workers most (from a bucket, the storage's limit where one held it: latency,
bandwidth, the request rate), which is what holds the next accelerator back; where its
ranks' loops and workers outnumbered the host's cores, that too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from facebench.host.resources import cores_per_rank


@dataclass(frozen=True)
class Tried:
    accelerators: int
    au: float
    passed: bool
    dominant_stage: str
    min_au: float
    cores: int = 0  # the cores the run could use (its tag cpu_cores); 0 where not recorded


def _key(params: Mapping[str, Any], tags: Mapping[str, Any]) -> tuple[str, str, str]:
    """Runs of one loader, n_workers and accelerator at one rate, host share and sync, from
    one storage (a sweep over custom rates, batch sizes, crops, accelerator.host_cpu, sync or
    storage profiles gives each its own line)."""
    name, rate = str(params["accelerator.name"]), float(params.get("accelerator_images_per_s") or 0)
    accelerator = f"{name} ({rate:,.0f} images/s)" if rate else name
    # How much of a core each rank's loop spun while it waited, and when it waited: what a GPU
    # run's host pays (facebench/run/accelerator.py). Said only where it is not the default.
    host_cpu = float(params.get("accelerator.host_cpu", 1.0))
    sync = str(params.get("accelerator.sync", "every_step"))
    if host_cpu != 1.0 or sync != "every_step":
        accelerator += f" [host_cpu {host_cpu:g}, sync {sync}]"
    if tags.get("storage_distance"):  # a bucket at an emulated distance
        accelerator += f" from {tags['storage_distance']}"
    elif tags.get("storage_endpoint"):  # a bucket as it answers
        accelerator += f" from {tags['storage_endpoint']}"
    return str(params.get("loader")), str(params.get("n_workers")), accelerator


def grouped(runs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Tried]]:
    """(loader, n_workers, accelerator) -> the counts tried, fewest first; `runs` are
    results.json's shape: params, metrics, tags (finished runs of an emulated accelerator)."""
    found: dict[tuple[str, str, str], list[Tried]] = defaultdict(list)
    for run in runs:
        params, metrics, tags = run.get("params", {}), run.get("metrics", {}), run.get("tags", {})
        if params.get("accelerator.name", "none") == "none" or "au" not in metrics:
            continue
        tried = Tried(
            int(params.get("accelerators_per_host", 1)),
            float(metrics["au"]),
            bool(metrics.get("au_pass")),
            # From a bucket, the storage's limit where one held the loader back (latency,
            # bandwidth, the request rate), else the stage that cost its workers most.
            str(tags.get("storage_limit") or tags.get("dominant_stage", "")),
            float(params.get("accelerator.min_au", 0.90)),
            int(tags.get("cpu_cores", 0) or 0),
        )
        found[_key(params, tags)].append(tried)
    return {key: sorted(tries, key=lambda t: t.accelerators) for key, tries in found.items()}


def lines(runs: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per loader, n_workers and accelerator: how many it feeds, and what stops more."""
    said = []
    for (loader, workers, accelerator), tries in sorted(grouped(runs).items()):
        min_au = tries[0].min_au
        fed = [t for t in tries if t.passed]
        most = max(fed, key=lambda t: t.accelerators) if fed else None
        text = f"{loader}, {workers} worker{'' if workers == '1' else 's'}: "
        if most is None:
            text += f"feeds no {accelerator} at AU >= {min_au:.0%}"
        else:
            text += (
                f"feeds {most.accelerators} {accelerator} per host at AU >= {min_au:.0%} "
                f"(AU {most.au:.1%})"
            )
        above = [t for t in tries if t.accelerators > (most.accelerators if most else 0)]
        if above:
            nxt = min(above, key=lambda t: t.accelerators)
            causes = [c for c in (nxt.dominant_stage, _crowded(nxt, workers)) if c]
            held = f", held back by {' and '.join(causes)}" if causes else ""
            text += f"; with {nxt.accelerators}: AU {nxt.au:.1%}{held}"
        elif most is not None:
            text += f"; {most.accelerators} is the most tried"
        said.append(text)
    return said


def _crowded(tried: Tried, workers: str) -> str:
    """Where the ranks' loops and their workers outnumbered the cores the run could use: then
    no rank had a core for its loop and each worker, however little its stages cost."""
    if not tried.cores or not workers.isdigit():
        return ""
    if tried.accelerators * cores_per_rank(int(workers)) <= tried.cores:
        return ""
    return (
        f"{tried.cores} cores for {tried.accelerators} ranks' loops and "
        f"{tried.accelerators * int(workers)} workers"
    )
