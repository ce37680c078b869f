"""One benchmark job: config -> data -> loader -> timed epochs -> metrics -> MLflow and JSON."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from facebench import loaders
from facebench.config import validate
from facebench.data.roots import data_root, shards_root
from facebench.data.sources import label_space
from facebench.data.transforms import seed_transform
from facebench.device import Precision, device_name, resolve_device, resolve_precision
from facebench.epoch import build_trainer, run_epoch
from facebench.loaders.base import LoaderContext
from facebench.tracking import Tracker, flatten, git_commit, write_results

log = logging.getLogger(__name__)


def run_name(cfg: DictConfig, precision: str) -> str:
    """dataset-w5-bs600-fp16; the model is named when it is not the seed's ResNet-50."""
    name = f"{cfg.loader.name}-w{cfg.n_workers}-bs{cfg.batch_size}"
    if cfg.model.name == "none":
        return f"{name}-loader-only"
    name = f"{name}-{precision}"
    return name if cfg.model.name == "resnet50" else f"{name}-{cfg.model.name}"


def run_training(cfg: DictConfig, output_dir: Path | None = None) -> dict[str, float]:
    """Run cfg.epochs timed epochs of the configured loader and model; return the last metrics."""
    validate(cfg)
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.amp.mode, device)
    name = run_name(cfg, precision.name)
    params: dict[str, Any] = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update(
        loader=cfg.loader.name,
        data=cfg.data.name,
        model=cfg.model.name,
        amp=precision.name,
        device_type=device.type,
    )
    tags = {
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "git_commit": git_commit(),
    }
    tracker = Tracker(enabled=cfg.tracking)
    with tracker.run(name, params, tags):
        metrics = _run(cfg, device, precision, tracker)
        results = {"run_name": name, "params": params, "tags": tags, "metrics": metrics}
        if output_dir is not None:
            path = output_dir / "results.json"
            write_results(path, results)
            tracker.log_artifact(path)
            config_path = output_dir / ".hydra" / "config.yaml"
            if config_path.is_file():
                tracker.log_artifact(config_path)
    return metrics


def _run(
    cfg: DictConfig, device: torch.device, precision: Precision, tracker: Tracker
) -> dict[str, float]:
    torch.manual_seed(cfg.seed)
    root = data_root(cfg.data, n_procs=max(cfg.n_workers, 1))
    labels = label_space(root)
    loader = loaders.get(cfg.loader.name)
    ctx = LoaderContext(
        options=cfg.loader,
        data_root=root,
        labels=labels,
        batch_size=cfg.batch_size,
        n_workers=cfg.n_workers,
        seed=cfg.seed,
        device=device,
        transform=seed_transform(cfg.loader.crop),
        shards_dir=shards_root(cfg.shards_dir, root, cfg.loader.name),
        shard_size=cfg.shard_size,
    )
    setup_metrics: dict[str, float] = {}
    if hasattr(loader, "before_epoch"):
        setup_metrics = loader.before_epoch(ctx)
    trainer = None
    if cfg.model.name != "none":
        trainer = build_trainer(
            cfg.model.name,
            labels.n_classes,
            device,
            precision,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        )
    log.info(
        "data %s (%d classes), loader=%s, model=%s, %s on %s",
        root,
        labels.n_classes,
        cfg.loader.name,
        cfg.model.name,
        precision.name,
        device,
    )
    metrics: dict[str, float] = dict(setup_metrics)
    for epoch in range(cfg.epochs):
        result = run_epoch(lambda: loader.build(ctx), trainer, device, cfg.max_batches)
        epoch_metrics = result.metrics()
        tracker.log_metrics(epoch_metrics, step=epoch)
        metrics.update(epoch_metrics)
        times = result.times
        log.info(
            "epoch %d: %d images in %.1f s = %.1f images/s (steady %.1f); first batch after "
            "%.2f s; waited for data %.0f%% of the time",
            epoch,
            times.samples_seen,
            times.epoch_time_s,
            times.images_per_s,
            times.steady_images_per_s,
            times.time_to_first_batch_s,
            100 * times.data_wait_frac,
        )
    tracker.log_metrics(setup_metrics)
    return metrics
