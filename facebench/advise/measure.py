"""Each loader's host-side rate at more and more workers, and why one falls short."""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from facebench import loaders, stages
from facebench.config import AdviseConfig, TrainConfig
from facebench.data.job_data import JobData
from facebench.host import shared_memory
from facebench.host.resources import usable_cores
from facebench.loaders.shared import LoaderContext
from facebench.loaders.spec import LoaderSpec
from facebench.run.epoch import EpochSettings, run_epoch
from facebench.run.job import Job
from facebench.shards.manifest import Manifest
from facebench.storage.bounds import Bounds
from facebench.storage.distance import Distance, counters, snapshot

SHM_NOTE = "shared memory too small"  # how a skip for /dev/shm starts, in the table
log = logging.getLogger("facebench.advise")

# A loader chosen for the headroom it leaves: at 20% above the device's pace it keeps up when the
# machine is busier, the data bigger or colder than when advise measured it.
HEADROOM = 1.2
# More workers are not tried once a loader outruns the ceiling by this much: the headroom the
# choice asks for, or a roomy loader's next worker count would go unmeasured.
ENOUGH = HEADROOM
RUN_S = (2.0, 15.0)  # shortest and longest measurement of one loader at one worker count


@dataclass
class Measured:
    """One loader's measurements: its shards, and its rate at each worker count."""

    name: str
    prepare_s: float = 0.0
    shard_bytes: int = 0
    rates: dict[int, float] = field(default_factory=dict)  # n_workers -> steady images/s
    first_batch_s: dict[int, float] = field(default_factory=dict)
    # n_workers -> its stage_* metrics (facebench/stages.py), and storage_* where it read a
    # bucket (facebench/fetches.py)
    stages: dict[int, dict[str, float]] = field(default_factory=dict)
    note: str = ""  # why it was not (fully) measured

    def stage_us(self, stage: str) -> float | None:
        """Workers' CPU time per image in `stage` at the best worker count, if measured."""
        return self.stages.get(self.best()[0], {}).get(f"stage_{stage}_cpu_us")

    def fewest_feeding(self, ceiling: float) -> int | None:
        fed = [w for w, rate in sorted(self.rates.items()) if rate >= ceiling]
        return fed[0] if fed else None

    def best(self) -> tuple[int, float]:
        return max(self.rates.items(), key=lambda item: item[1]) if self.rates else (0, 0.0)


def worker_counts(requested: list[int]) -> list[int]:
    """The worker counts to try: those asked for, or 1, 2, 4, ... up to the cores."""
    if requested:
        return sorted(set(requested))
    cores = usable_cores()
    counts, step = {1, cores}, 2
    while step < cores:
        counts.add(step)
        step *= 2
    return sorted(counts)


def with_loader(cfg: AdviseConfig, name: str, **changes: object) -> TrainConfig:
    """The run's config with loader=<name> (its options' defaults, the run's crop and prefetch),
    as `loader=<name>` on the command line would give."""
    if loaders.get(name).own is not None and name == cfg.loader.name:
        return replace(cfg, **changes)  # a user's own pipeline: its options are what it is
    options = loaders.get(name).options(
        name=name, crop=cfg.loader.crop, prefetch_factor=cfg.loader.prefetch_factor
    )
    return replace(cfg, loader=options, **changes)


def measure_loader(
    name: str,
    cfg: AdviseConfig,
    job: Job,
    data: JobData,
    counts: list[int],
    deadline: float,
    ceiling: float,
    via: str = "",
    distance: Distance | None = None,
    own: Any = None,
) -> Measured:
    """Shards first (timed apart), then the host-side rate at more and more workers; `via`:
    the relay emulating the bucket's `distance`, whose counters each measurement reads; `own`:
    a user's own pipeline, built (facebench/advise/own.py)."""
    distance = distance or Distance()
    measured = Measured(name)
    cfg = with_loader(cfg, name, model="none", host_only=True)
    spec = loaders.get(name)
    ctx = replace(loaders.context(cfg, spec, data.listing, job.device), own=own)
    loaders.set_up(cfg, spec, ctx, job.world)  # shared memory: per worker count, below
    manifest = Manifest.read(ctx.shards_dir) if ctx.shards_dir is not None else None
    if manifest is not None:
        measured.prepare_s = manifest.prepare_s  # as long as building took, now or before
        measured.shard_bytes = sum(shard.bytes for shard in manifest.shards)
    for index, workers in enumerate(counts):
        left = deadline - time.perf_counter()
        per_run = min(RUN_S[1], max(RUN_S[0], left / max(1, len(counts) - index)))
        if left < per_run:
            measured.note = f"budget spent before n_workers={workers}"
            break
        # Host side: the loop holds the one batch in its hands.
        in_flight = loaders.in_flight(name, spec, replace(ctx, n_workers=workers), loop_holds=1)
        room = shared_memory.space()
        if in_flight is not None and not in_flight.fits(room):
            # More workers would need more: the counts left are skipped too.
            measured.note = (
                f"{SHM_NOTE} from n_workers={workers}: {in_flight.describe()}, but "
                f"{room.describe()}"
            )
            break
        _measure_once(measured, spec, replace(ctx, n_workers=workers), job, per_run, via, distance)
        if workers not in measured.rates:
            log.warning("%s: %s", name, measured.note)
            break
        log.info(
            "%s, n_workers=%d: %.0f images/s (host side)", name, workers, measured.rates[workers]
        )
        if measured.rates[workers] >= ENOUGH * ceiling:
            break  # more workers would only use more of the machine
    return measured


def _measure_once(
    measured: Measured,
    spec: LoaderSpec,
    sized: LoaderContext,
    job: Job,
    run_s: float,
    via: str,
    distance: Distance,
) -> None:
    """One host-side run of `run_s` at sized.n_workers, recorded in `measured` unless its rate
    passed the bounds of the bucket's distance (then a note says so)."""
    workers = sized.n_workers
    settings = EpochSettings(
        job.device,
        sample_hz=0,
        host_only=True,
        time_limit_s=run_s,
        geometry=sized.geometry,
        in_flight=workers * sized.options.prefetch_factor,
    )
    with spec.held(sized):  # its service (Ray's cluster), outside the epoch's clock
        before = snapshot(via) if via else {}
        result = run_epoch(functools.partial(spec.build, sized), None, settings)
        relayed = counters(via, before) if via else {}
    # Its stages, its GETs (from a bucket) and the images they brought: what held it back.
    metrics = result.stages | relayed | {"samples_seen": float(result.times.samples_seen)}
    rate = result.times.rate
    bounds = Bounds.of(metrics, distance) if via else None
    if bounds is not None and bounds.beyond(rate):
        # Its steady window held none of its reads (a few large objects fetched in the warm-up,
        # as LitData's chunks are): the whole epoch's rate includes them.
        rate = result.times.images_per_s
    if bounds is not None and bounds.beyond(rate):
        # Faster than its own requests allow: the window missed reads it depended on.
        measured.note = (
            f"n_workers={workers} measured {rate:,.0f} images/s, above the {bounds.lowest:,.0f} "
            "its requests allow: a measurement error, not used"
        )
        return
    measured.rates[workers] = rate
    measured.first_batch_s[workers] = result.times.time_to_first_batch_s
    measured.stages[workers] = metrics


def shortfall(
    measured: Measured, ceiling: float, cores: int, others: list[Measured] | None = None
) -> str:
    """Why a loader does not keep the device fed, in one line: how it scales, and the stage
    that costs its workers most."""
    if not measured.rates:
        return measured.note or "not measured"
    scaling = _scaling(measured, ceiling, cores)
    costly = costly_stage(measured, others or [])
    text = f"{scaling}. {costly}" if costly else scaling
    return f"{text}; {measured.note}" if measured.note else text


def costly_stage(measured: Measured, others: list[Measured]) -> str:
    """The stage that costs the workers most CPU time, and the measured loader that pays least
    for it if one pays under a quarter as much: "decode: 64% of the workers' CPU time per
    image; loader=raw spends 0 us per image there (this one 640)"."""
    metrics = measured.stages.get(measured.best()[0], {})
    name = stages.dominant(metrics)
    if name is None or f"stage_{name}_cpu_us" not in metrics:
        return ""
    mine = metrics[f"stage_{name}_cpu_us"]
    text = f"{name}: {metrics[f'stage_{name}_cpu_frac']:.0%} of the workers' CPU time per image"
    lighter = [
        (us, other.name)
        for other in others
        if other.name != measured.name
        and loaders.get(other.name).own is None  # its stages split the work otherwise
        and (us := other.stage_us(name)) is not None
        and us < 0.25 * mine
    ]
    if lighter:
        us, other = min(lighter)
        text += f"; loader={other} spends {us:,.0f} us per image there (this one {mine:,.0f})"
    return text


def _scaling(measured: Measured, ceiling: float, cores: int) -> str:
    counts = sorted(measured.rates)
    low, high = counts[0], counts[-1]
    best_workers, best = measured.best()
    if counts == [cores]:
        # One count, the cores' own: nothing says how it scales, only what it would need.
        needed = math.ceil(ceiling / (best / low))
        return (
            f"{best:,.0f} images/s with {low} worker{'s' if low > 1 else ''}, one per core this "
            f"run may use; at that rate per worker, the device needs {needed} workers"
        )
    if len(counts) > 1 and measured.rates[high] >= 1.5 * measured.rates[low]:
        per_worker = measured.rates[high] / high
        needed = math.ceil(ceiling / per_worker)
        return (
            f"about {per_worker:,.0f} images/s per worker: the device needs {needed} workers, "
            f"this run may use {cores} cores"
        )
    return (
        f"does not scale with workers ({measured.rates[low]:,.0f} images/s with {low}, "
        f"{best:,.0f} at best with {best_workers}): bound by something other than the cores"
    )
