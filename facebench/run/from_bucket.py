"""What a run from a bucket says at its end: the bounds its rate could not pass, which limit held
it, and, where its rate passed a bound, that the measurement, not the loader, is at fault.

    say_from_bucket(cfg, world_size, distance, metrics, results, tracker)   # rank 0, once

The bounds (storage/bounds.py) and the limit (storage/limits.py) come from the job's own
metrics, merged over its ranks, and the distance its requests met (none for a real bucket,
whose limits are unknown here: only the client's CPU per GET is said then).
"""

from __future__ import annotations

import logging

from facebench import loaders
from facebench.config import TrainConfig, Workers
from facebench.host.resources import usable_cores
from facebench.results import JobResults
from facebench.run.accelerator import Accelerator
from facebench.storage.bounds import Bounds
from facebench.storage.distance import Distance
from facebench.storage.limits import held_by, holding_back, images_per_request, mb_per_request
from facebench.tracking.tracker import Tracker

log = logging.getLogger(__name__)

# Below this share of the epoch waiting for batches, the loop (the model, the device) set the pace.
NOT_WAITING = 0.1


def say_from_bucket(
    cfg: TrainConfig,
    ranks: int,
    distance: Distance,
    metrics: dict[str, float],
    results: JobResults,
    tracker: Tracker,
) -> None:
    """Log, record and tag a bucket run's bounds and what held it (its metrics gain the bounds
    and storage_beyond_bounds; its tags storage_held_by and storage_limit)."""
    bounds = Bounds.of(metrics, distance)
    if bounds is None:  # local files
        return
    whole = metrics.get("images_per_s", 0.0)
    rate = metrics.get("steady_images_per_s", whole)
    found = {
        **bounds.metrics(),
        **_client_metrics(cfg, ranks, metrics, bounds),
        "storage_beyond_bounds": float(bounds.beyond(rate)),
    }
    metrics.update(found)
    tracker.log_metrics(found)
    if "storage_client_cores_per_accelerator" in found:
        log.info(
            "from the bucket, storage.client=%s at %.2f ms of CPU a GET needs %.2f cores to "
            "feed one %s", cfg.storage.client, bounds.client_ms_per_get,
            found["storage_client_cores_per_accelerator"], cfg.accelerator.name,
        )  # fmt: skip
    if bounds.beyond(rate):
        # A loader that fetches a few large objects early (LitData's chunks) reads them all in
        # its warm-up: the steady window then holds none of the reads its batches came from.
        fits = not bounds.beyond(whole)
        log.warning(
            "from the bucket: %s images/s (steady) measured, above the %s images/s its own "
            "requests allow (%s): a measurement error, the steady window left out the reads "
            "its batches depended on; %s", f"{rate:,.0f}", f"{bounds.lowest:,.0f}",
            _said(bounds),
            f"the whole epoch's {whole:,.0f} images/s includes them: compare that" if fits
            else "the whole epoch's rate is beyond them too: not a rate to compare",
        )  # fmt: skip
        rate = whole if fits else rate
    elif bounds.lowest:
        log.info("from the bucket, bounds: %s", _said(bounds))
    if metrics.get("au_pass"):  # the emulated accelerators were fed: they set the pace
        return
    if metrics.get("data_wait_frac", 1.0) < NOT_WAITING:  # the model set the pace, not the data
        return
    workers = cfg.n_workers * ranks  # the job's rate is every rank's, and so are its workers
    kind = held_by(metrics, rate, distance, workers, usable_cores(), ranks)
    if kind is not None:
        results.tags["storage_held_by"] = kind
        tracker.set_tags({"storage_held_by": kind})
    limit = holding_back(metrics, rate, distance, workers, usable_cores(), ranks)
    if limit is not None:
        log.info("from the bucket, held back by %s", limit.detail)
        results.tags["storage_limit"] = limit.short
        tracker.set_tags({"storage_limit": limit.short})


def _client_metrics(
    cfg: TrainConfig, ranks: int, metrics: dict[str, float], bounds: Bounds
) -> dict[str, float]:
    """What the S3 client did and cost: GETs a second per process that made them (each worker,
    or the loop with n_workers=0), its CPU per MB, and the cores its CPU per GET takes to feed
    the named accelerator at its pace."""
    found = {}
    # The processes that made the GETs: each worker process, or the loop's own (its threads').
    traits = loaders.get(cfg.loader.name).traits_for(cfg.loader)
    apart = traits.workers == Workers.process and cfg.n_workers > 0
    processes = (cfg.n_workers if apart else 1) * ranks
    found["storage_gets_per_s_per_process"] = metrics.get("storage_requests_per_s", 0.0) / processes
    size_mb = mb_per_request(metrics)
    if bounds.client_ms_per_get and size_mb:
        found["storage_client_ms_per_mb"] = bounds.client_ms_per_get / size_mb
    accelerator = Accelerator.of(cfg.accelerator, cfg.transform.crop, cfg.batch_size)
    per_request = images_per_request(metrics)
    if accelerator is not None and bounds.client_ms_per_get and per_request:
        gets_per_s = accelerator.images_per_s / per_request
        found["storage_client_cores_per_accelerator"] = gets_per_s * bounds.client_ms_per_get / 1000
    return found


def _said(bounds: Bounds) -> str:
    parts = []
    if bounds.distance:
        parts.append(f"the distance {bounds.distance:,.0f} images/s")
    if bounds.request_rate:
        parts.append(f"the request rate {bounds.request_rate:,.0f}")
    if bounds.link:
        parts.append(f"the host's link {bounds.link:,.0f}")
    if bounds.client_ms_per_get:
        parts.append(f"the client's CPU {bounds.client_ms_per_get:.2f} ms a GET")
    return ", ".join(parts)
