"""One benchmark job, as its stages: prepare the data, build the loader, measure epochs, record.

config -> records -> loader -> epoch loop -> meter -> tracker (MLflow and results.json)
"""

from __future__ import annotations

import logging
import posixpath
import random
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from facebench import loaders, stages
from facebench.config import TrainConfig
from facebench.data.job_data import JobData, list_data
from facebench.errors import Interrupted, TrackingLost, interruption
from facebench.host.paths import cache_dir
from facebench.loaders.shared import LoaderContext
from facebench.loaders.spec import LoaderSpec
from facebench.measure.epoch_lines import summarise
from facebench.results import TRACKING_LOGGED, TRACKING_LOST, JobResults, now_ms
from facebench.run import per_host
from facebench.run.cost import say_cost
from facebench.run.finish import batches_held
from facebench.run.from_bucket import say_from_bucket
from facebench.run.job import Job
from facebench.run.measurement import measure
from facebench.storage.distance import counters, emulated, in_effect, snapshot
from facebench.tracking.store import tracking_uri, ui_command
from facebench.tracking.tracker import UPLOAD_COMMAND, Tracker

log = logging.getLogger(__name__)

# Metrics of the job rather than of an epoch: logged once.
ONCE = (
    "prepare_s",
    "samples_skipped",
    "listing_s",
    "n_shards",
    "shard_size_used",
    "ray_start_s",
    "ray_nodes",
    "ray_cpus",
    "ray_start_mem_mb",
)


def run_training(
    cfg: TrainConfig,
    output_dir: Path | None = None,
    sweep_id: str | None = None,
    multirun: bool = False,
) -> dict[str, float]:
    """Run the configured epochs `repeat` times; return the last epoch's metrics and summaries.

    Everything the job records goes to results.json in `output_dir` however the job ends. If
    MLflow fails once the run has started, the job still finishes, then raises TrackingLost.
    """
    if per_host.wanted(cfg):  # several emulated accelerators: this job is their ranks
        return per_host.run_ranks(cfg, output_dir, sweep_id, multirun)
    job = Job.start(cfg)
    if cfg.model != "none" and job.accelerator is None and job.world.is_main:
        log.info("precision: %s on %s", job.precision.describe(), job.device)
    # Only rank 0 records anything; the other ranks train and report their metrics to it.
    output_dir = output_dir if job.world.is_main else None
    tracker = Tracker(enabled=cfg.tracking and job.world.is_main, kept_in=output_dir)
    tracker.check_store()  # in seconds, before any long work
    results = JobResults(job.name(cfg), job.params(cfg), job.tags(sweep_id), multirun=multirun)
    results.tags["job_id"] = results.job_id  # how facebench.upload finds this run again
    # The loader's service (Ray) is left last: its shutdown is the one step that could end
    # this process, so the MLflow run has ended and results.json is on disk before it.
    with ExitStack() as service:
        try:
            ready = _get_ready(cfg, job, results, service)
            with tracker.run(results.run_name, results.params, results.tags, system_metrics=True):
                _run_recorded(cfg, job, tracker, results, output_dir, ready)
        finally:
            # Written again: the store may have failed after the copy MLflow took, or at the end.
            results.end_time_ms = now_ms()
            if tracker.lost is not None:
                results.tracking, results.tracking_error = TRACKING_LOST, tracker.lost
            if output_dir is not None:
                results.write(output_dir)
    if tracker.lost is not None:
        raise TrackingLost(
            f"run {results.run_name} finished but is not in MLflow ({tracker.lost}); "
            f"everything it recorded is in {output_dir}/results.json. Once MLflow answers: "
            f"{UPLOAD_COMMAND} {output_dir}"
        )
    if not multirun and results.compare_url:  # a sweep says it once, at its end
        log.info("every run side by side: %s", results.compare_url)
        if results.ui_command:
            log.info("(start the UI first: %s)", results.ui_command)
    return results.metrics


@dataclass(frozen=True)
class _Ready:
    """A job that nothing refused: its data listed and checked, its loader prepared."""

    data: JobData
    loader: LoaderSpec
    ctx: LoaderContext
    via: str = ""  # the relay emulating a bucket's distance, where one runs


def _get_ready(cfg: TrainConfig, job: Job, results: JobResults, service: ExitStack) -> _Ready:
    """Everything that can refuse the run on its config, data or resources, before its MLflow
    run opens (a typo in data.root leaves no FAILED run behind): the data listed and checked,
    the loader's library, its shards built, its workers held against the memory, its service
    for the job (Ray's cluster) started, in `service`."""
    try:
        _seed_everything(cfg.seed)
        loader = loaders.get(cfg.loader.name)
        loader.check_storage(cfg.storage.name, f"loader={cfg.loader.name}", cfg.storage.client)
        # A bucket's distance, where asked for: the relay runs for the whole job.
        via = service.enter_context(emulated(cfg.storage, cache_dir(cfg.data.cache_dir), cfg.seed))
        # A user's own pipeline reads its own data: it is built here, in place of data='s.
        own = loader.own(cfg) if loader.own is not None else None
        data = list_data(cfg, job.world, via) if own is None else own.job_data()
        results.metrics.update(data.metrics())
        results.tags.update(data.storage_tags)
        if loader.own_client and "storage_client" in results.tags:  # its library's, not ours
            results.tags["storage_client"] = loader.own_client.split(",")[0]
        ctx = replace(loaders.context(cfg, loader, data.listing, job.device, job.world), own=own)
        held = batches_held(job.device, cfg.host_only or job.accelerator is not None)
        results.metrics.update(loaders.set_up(cfg, loader, ctx, job.world, loop_holds=held))
        results.metrics.update(service.enter_context(loader.held(ctx)))
    except BaseException as error:
        stop = interruption(error)
        if stop is None:
            raise
        results.status = "KILLED"
        outcome = f"stopped before run {results.run_name} began; shards built so far are kept"
        raise Interrupted.of(stop, outcome) from error
    if "shard_size_used" in results.metrics:  # beside shard_size, which it may be smaller than
        results.params["shard_size_used"] = int(results.metrics["shard_size_used"])
    # The runs view's column: which data, how much.
    results.tags["data_set"] = (
        data_label(cfg, ctx.data_root, len(ctx.records)) if own is None else own.label()
    )
    if own is not None:  # said, never passed: facebench has no records of the user's samples
        results.tags["samples_checked"] = "not checked (each once, labels, pixels)"
    if data.listing.labels.classes:  # folder data: which class each label index stands for
        results.classes = data.listing.labels.class_map()
    return _Ready(data, loader, ctx, via)


def _run_recorded(
    cfg: TrainConfig,
    job: Job,
    tracker: Tracker,
    results: JobResults,
    output_dir: Path | None,
    ready: _Ready,
) -> None:
    """The job inside its MLflow run: results.json written however it ends, then logged."""
    results.run_id = tracker.run_id or ""
    if tracker.run_id:
        results.tracking = TRACKING_LOGGED
    _where_to_compare(tracker, results)
    try:
        _run(cfg, job, tracker, results, ready)
        results.status = "FINISHED"
    except BaseException as error:
        stop = interruption(error)
        if stop is None:
            raise
        results.status = "KILLED"
        recorded = "marked KILLED in MLflow" if tracker.enabled else "stopped (tracking=false)"
        outcome = f"run {results.run_name} {recorded}; shards built so far are kept"
        raise Interrupted.of(stop, outcome) from error
    finally:
        if output_dir is not None:  # nothing measured is lost, whatever happens next
            results.end_time_ms = now_ms()
            results.write(output_dir)
    if output_dir is not None:
        tracker.log_artifact(output_dir / "results.json")
        tracker.log_artifact(output_dir / ".hydra" / "config.yaml")


def _where_to_compare(tracker: Tracker, results: JobResults) -> None:
    """The MLflow UI's URL that shows this run's numbers beside the others' (a sweep's own
    view, or every run), and the command that starts the UI; nothing without tracking."""
    if tracker.url() is None:
        return
    sweep_id = results.tags.get("sweep_id")
    if results.multirun and sweep_id:
        key, search = f"sweep-{sweep_id}", f"tags.sweep_id = '{sweep_id}'"
        url = tracker.share_view(key, key, search)
    else:
        url = tracker.url()
    results.compare_url, results.ui_command = url or "", ui_command(tracking_uri())


def _run(cfg: TrainConfig, job: Job, tracker: Tracker, results: JobResults, ready: _Ready) -> None:
    data, loader, ctx = ready.data, ready.loader, ready.ctx
    metrics, labels = results.metrics, data.listing.labels
    if results.classes:
        tracker.log_dict(results.classes, "classes.json")
    trainer = job.trainer(cfg, labels)
    if job.accelerator is not None:
        consumer = f"an emulated {job.accelerator.describe()}, loader on {job.device}"
    else:
        host_only = " (host only)" if cfg.host_only else ""
        consumer = f"model={cfg.model}{host_only}, {job.precision.name} on {job.device}"
    # Objects in a bucket have no page cache here: the GETs go to the endpoint every epoch.
    where = (
        f"cache={cfg.cache}"
        if cfg.storage.name == "local"
        else f"from {data.storage_tags['storage_endpoint']}"
    )
    if ctx.own is None:
        log.info(
            "data %s (%d samples, %d classes), loader=%s, %s, %s",
            ctx.data_root,
            len(ctx.records),
            labels.n_classes,
            cfg.loader.name,
            consumer,
            where,
        )
    else:  # its data are its own: said as it was built
        log.info("loader=%s, %s", cfg.loader.name, consumer)
    relay_start = snapshot(ready.via) if ready.via else None  # the relay over the epochs only
    per_epoch = measure(cfg, job, loader, ctx, trainer, tracker, results.epochs)
    summary = summarise(per_epoch)
    metrics.update({**per_epoch[-1], **summary})  # the last epoch's, and the summaries
    tracker.log_metrics({**summary, **{k: v for k, v in metrics.items() if k in ONCE}})
    if ready.via:  # every 503 the relay sent, those the clients retried unseen included
        relayed = counters(ready.via, relay_start)
        metrics.update(relayed)
        tracker.log_metrics(relayed)
    # The limits are the emulated ones where a relay ran; a real bucket's are unknown here.
    emulated_distance = in_effect(cfg.storage, ready.via)
    if job.world.is_main:  # the job's metrics, merged over its ranks: said once
        ranks = job.world.world_size
        say_from_bucket(cfg, ranks, emulated_distance, metrics, results, tracker)
        say_cost(cfg, ranks, metrics, tracker)
    label = stages.dominant_label(metrics)
    if label:  # the runs table shows where the workers' time went
        results.tags["dominant_stage"] = label
        tracker.set_tags({"dominant_stage": label})
    if data.skipped:
        log.warning("on_bad_sample=skip: %d samples were left out (samples_skipped)", data.skipped)


def data_label(cfg: TrainConfig, root: Path | str, n_samples: int) -> str:
    """'synthetic 6,000', 'synthetic folder 10,000', 'folder mine 3,000', 'synthetic 6,000 (s3)':
    the data set a run read, so that runs on different sets with the same name are told apart."""
    name = cfg.data.name
    if name == "folder":
        name = f"folder {posixpath.basename(str(root).rstrip('/'))}"
    elif name == "synthetic" and cfg.data.layout != "faces":
        name = f"synthetic {cfg.data.layout}"
    where = " (s3)" if cfg.storage.name == "s3" else ""
    return f"{name} {n_samples:,}{where}"


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
