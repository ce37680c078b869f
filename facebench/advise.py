"""Which pipeline keeps your device fed, and with how few workers: measured here, in a budget.

    python -m facebench.advise                                  # the synthetic stand-in
    python -m facebench.advise data=celeba_digiface data.root=/data/faces budget_s=600
    python -m facebench.advise model=resnet18 batch_size=256 device=cuda:1

It takes train.py's overrides (data, model, device, batch_size, ...) and a few of its own:
budget_s (300), sample_images (20,000: larger sets are measured on a sample, linked into the
cache), loaders (all that are installed), workers (1, 2, 4, ... up to the cores) and out (a
folder for the results; outputs/advise/<time> by default). Then:

1. the compute ceiling: the model training on one batch made once on the device;
2. for each loader, its shards built (timed apart) and its host-side rate (host_only=true: what a
   GPU run receives) with more and more workers, until it outruns the ceiling;
3. the answer: which loaders keep the device fed and with how few workers, the predicted epoch
   time for the whole set, shard build time and disk, and why each other loader falls short.

The table and a chart are printed and written under outputs/advise/, and logged as one run of the
`facebench-reports` experiment (tracking=false to skip).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from facebench import loaders
from facebench.config import validate
from facebench.data.sample import sample_tree
from facebench.data.sources import Layout
from facebench.epoch import EpochSettings, run_epoch
from facebench.errors import ConfigError, FacebenchError
from facebench.jobs import configure
from facebench.paths import PROJECT_ROOT, cache_dir, data_layout
from facebench.report import loader_colour
from facebench.resources import usable_cores
from facebench.runner import Data, Job, build_loader, prepare_data, trainer_for
from facebench.shards import room
from facebench.shards.manifest import Manifest
from facebench.tracking import REPORTS_EXPERIMENT, Tracker

log = logging.getLogger("facebench.advise")

OWN_KEYS = {"budget_s": 300.0, "sample_images": 20_000, "loaders": "", "workers": "", "out": ""}
ENOUGH = 1.1  # a loader keeps the device fed when it outruns the ceiling by this much
_CEILING_SHARE = 0.15  # of the budget, at most, for the compute ceiling
_RUN_S = (2.0, 15.0)  # shortest and longest measurement of one loader at one worker count
_LOADER_MIN_S = 10.0  # what one loader needs at least: shards for a sample, a few short runs


@dataclass
class Measured:
    """One loader's measurements: its shards, and its rate at each worker count."""

    name: str
    prepare_s: float = 0.0
    shard_bytes: int = 0
    rates: dict[int, float] = field(default_factory=dict)  # n_workers -> steady images/s
    first_batch_s: dict[int, float] = field(default_factory=dict)
    note: str = ""  # why it was not (fully) measured

    def fewest_feeding(self, ceiling: float) -> int | None:
        fed = [w for w, rate in sorted(self.rates.items()) if rate >= ceiling]
        return fed[0] if fed else None

    def best(self) -> tuple[int, float]:
        return max(self.rates.items(), key=lambda item: item[1]) if self.rates else (0, 0.0)


def parse(argv: list[str]) -> tuple[list[str], dict]:
    """train.py's overrides, and advise's own keys."""
    own, overrides = dict(OWN_KEYS), []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in own:
            own[key] = type(OWN_KEYS[key])(value)
        else:
            overrides.append(arg)
    if own["budget_s"] <= 0 or own["sample_images"] < 1:
        raise ConfigError("budget_s and sample_images must be positive")
    return overrides, own


def compose_run(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["tracking=false", *overrides])
    validate(cfg)
    return cfg


def worker_counts(requested: str) -> list[int]:
    if requested:
        return sorted({int(w) for w in requested.split(",")})
    cores = usable_cores()
    counts, step = {1, cores}, 2
    while step < cores:
        counts.add(step)
        step *= 2
    return sorted(counts)


def measure_ceiling(base: list[str], job: Job, data: Data, budget_s: float) -> float:
    """The model's training rate on one batch made once on the device: nothing to wait for."""
    cfg = compose_run([*base, "loader=synthetic"])
    spec = loaders.get("synthetic")
    ctx = loaders.context(cfg, spec, data.root, data.records, data.labels, job.device)
    settings = EpochSettings(
        job.device, sample_hz=0, time_limit_s=budget_s * _CEILING_SHARE, geometry=ctx.geometry
    )
    result = run_epoch(lambda: spec.build(ctx), trainer_for(cfg, job, data.labels), settings)
    return result.times.steady_images_per_s


def measure_loader(
    name: str,
    base: list[str],
    job: Job,
    data: Data,
    counts: list[int],
    deadline: float,
    ceiling: float,
) -> Measured:
    """Shards first (timed apart), then the host-side rate at more and more workers."""
    measured = Measured(name)
    cfg = compose_run([*base, f"loader={name}", "model=none", "host_only=true"])
    spec = loaders.get(name)
    ctx = loaders.context(
        cfg, spec, data.root, data.records, data.labels, job.device, data.excluded
    )
    build_loader(cfg, spec, ctx, job.world)
    manifest = Manifest.read(ctx.shards_dir) if spec.shard_format is not None else None
    if manifest is not None:
        measured.prepare_s = manifest.prepare_s  # as long as building took, now or before
        measured.shard_bytes = sum(shard.bytes for shard in manifest.shards)
    for index, workers in enumerate(counts):
        left = deadline - time.perf_counter()
        per_run = min(_RUN_S[1], max(_RUN_S[0], left / max(1, len(counts) - index)))
        if left < per_run:
            measured.note = f"budget spent before n_workers={workers}"
            break
        ctx.n_workers = workers
        settings = EpochSettings(
            job.device, sample_hz=0, host_only=True, time_limit_s=per_run, geometry=ctx.geometry
        )
        result = run_epoch(lambda: spec.build(ctx), None, settings)
        measured.rates[workers] = result.times.steady_images_per_s
        measured.first_batch_s[workers] = result.times.time_to_first_batch_s
        log.info(
            "%s, n_workers=%d: %.0f images/s (host side)", name, workers, measured.rates[workers]
        )
        if measured.rates[workers] >= ENOUGH * ceiling:
            break  # more workers would only use more of the machine
    return measured


def shortfall(measured: Measured, ceiling: float, cores: int) -> str:
    """Why a loader does not keep the device fed, in one line."""
    if not measured.rates:
        return measured.note or "not measured"
    counts = sorted(measured.rates)
    low, high = counts[0], counts[-1]
    best_workers, best = measured.best()
    if len(counts) > 1 and measured.rates[high] >= 1.5 * measured.rates[low]:
        per_worker = measured.rates[high] / high
        needed = math.ceil(ceiling / per_worker)
        return (
            f"about {per_worker:,.0f} images/s per worker: the device needs {needed} workers, "
            f"this machine has {cores} cores"
        )
    return (
        f"does not scale with workers ({measured.rates[low]:,.0f} images/s with {low}, "
        f"{best:,.0f} at best with {best_workers}): bound by something other than the cores"
    )


@dataclass
class Advice:
    """What advise found, and how it says so."""

    model: str
    device: str
    ceiling: float
    n_images: int
    n_sample: int
    measured: list[Measured]
    seconds: float
    budget_s: float
    counts: list[int] = field(default_factory=lambda: [1])
    ceiling_s: float = 0.0  # time spent measuring the ceiling

    def ordered(self) -> list[Measured]:
        """Loaders that keep the device fed first (fewest workers, then fastest), then the rest."""

        def key(m: Measured) -> tuple:
            fewest = m.fewest_feeding(self.ceiling)
            return (fewest is None, fewest or 0, -m.best()[1])

        return sorted(self.measured, key=key)

    def scale(self) -> float:
        return self.n_images / max(1, self.n_sample)

    def rows(self) -> list[list[str]]:
        rows = []
        for m in self.ordered():
            fewest = m.fewest_feeding(self.ceiling)
            best_workers, best = m.best()
            rate = min(self.ceiling, best) if m.rates else 0.0
            epoch = f"{self.n_images / rate:,.0f} s" if rate else "n/a"
            rows.append(
                [
                    m.name,
                    "yes" if fewest is not None else "no",
                    str(fewest) if fewest is not None else "-",
                    f"{best:,.0f} ({best_workers})" if m.rates else "-",
                    epoch,
                    f"{m.prepare_s * self.scale():,.1f} s" if m.shard_bytes else "-",
                    room.gb(m.shard_bytes * self.scale()) if m.shard_bytes else "-",
                    "" if fewest is not None else shortfall(m, self.ceiling, usable_cores()),
                ]
            )
        return rows

    def verdict(self) -> str:
        if not any(m.rates for m in self.measured):
            return self.nothing_measured()
        fed = [(m.fewest_feeding(self.ceiling), -m.best()[1], m.name) for m in self.measured]
        fed = sorted(f for f in fed if f[0] is not None)
        if not fed:
            best = max(self.measured, key=lambda m: m.best()[1])
            share = 100 * best.best()[1] / self.ceiling if self.ceiling else 0
            return (
                f"No loader keeps {self.model} on {self.device} fed ({self.ceiling:,.0f} "
                f"images/s); the closest is {best.name}, at {share:.0f}% with "
                f"{best.best()[0]} workers."
            )
        workers, _, name = fed[0]
        epoch = self.n_images / self.ceiling
        others = ", ".join(f"{n} ({w})" for w, _, n in fed[1:])
        also = f" Also fed, fewest workers first: {others}." if others else ""
        if len(fed) == len(self.measured) and all(w == min(self.counts) for w, _, _ in fed):
            also += " Every loader keeps up with the fewest workers: the model sets the pace here."
        return (
            f"Use loader={name} n_workers={workers}: it keeps {self.model} on {self.device} "
            f"fed ({self.ceiling:,.0f} images/s), one epoch of {self.n_images:,} images in "
            f"about {epoch:,.0f} s.{also}"
        )

    def nothing_measured(self) -> str:
        """What to change when the budget ran out before any loader was measured."""
        enough = self.ceiling_s + len(self.measured) * _LOADER_MIN_S
        smaller = (
            "a smaller batch_size"
            if self.model == "resnet18"
            else "model=resnet18 (amp=off on a CPU)"
        )
        return (
            f"Nothing was measured: budget_s={self.budget_s:,.0f} ran out after "
            f"{self.ceiling_s:,.0f} s on the compute ceiling ({self.model} at "
            f"{self.ceiling:,.1f} images/s), before any loader. Raise budget_s to about "
            f"{enough:,.0f} or more, or measure against {smaller}."
        )

    def markdown(self) -> str:
        header = [
            "loader",
            "keeps it fed",
            "fewest workers",
            "best host-side images/s (workers)",
            "predicted epoch",
            "shard build",
            "shard disk",
            "why not",
        ]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows()]
        sampled = (
            f" Measured on a sample of {self.n_sample:,} images; build time and disk are "
            "scaled to the whole set."
            if self.n_sample < self.n_images
            else ""
        )
        return (
            f"## facebench advise: {self.model} on {self.device}\n\n{self.verdict()}\n\n"
            f"Compute ceiling: {self.ceiling:,.0f} images/s. Data: {self.n_images:,} images."
            f"{sampled} Took {self.seconds:,.0f} s of a {self.budget_s:,.0f} s budget.\n\n"
            + "\n".join(lines)
            + "\n"
        )


def chart(advice: Advice, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [m for m in advice.ordered() if m.rates]
    names = [m.name for m in measured]
    values = [m.best()[1] for m in measured]
    figure, axis = plt.subplots(figsize=(9, 1.4 + 0.45 * len(names)))
    positions = list(range(len(names)))[::-1]
    bars = axis.barh(positions, values, color=[loader_colour(name) for name in names])
    workers = [m.best()[0] for m in measured]
    labels = [
        f"{v:,.0f} ({w} worker{'s' * (w != 1)})" for v, w in zip(values, workers, strict=True)
    ]
    axis.bar_label(bars, labels=labels, padding=3, fontsize=8)
    axis.set_yticks(positions, names)
    axis.axvline(advice.ceiling, color="black", linestyle="--", linewidth=1)
    label = f" {advice.model}: {advice.ceiling:,.0f}"
    axis.text(advice.ceiling, len(names) - 0.55, label, fontsize=8)
    spread = max([*values, advice.ceiling]) / max(1.0, min([*values, advice.ceiling]))
    if spread > 20:  # a CPU's model and a raw loader differ a thousandfold
        axis.set_xscale("log")
        axis.set_xlim(min([*values, advice.ceiling]) / 2, 4 * max([*values, advice.ceiling]))
    else:
        axis.set_xlim(0, 1.3 * max([*values, advice.ceiling]))
    axis.set_xlabel("images/s: each loader's host side at its best worker count, and the model")
    axis.set_title(f"Which loader keeps {advice.model} on {advice.device} fed", loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def advise(argv: list[str]) -> Advice:
    started = time.perf_counter()
    overrides, own = parse(argv)
    counts = worker_counts(own["workers"])
    overrides.append(f"n_workers={max(counts)}")  # what the resource check looks at
    cfg = compose_run(overrides)
    if cfg.model == "none":
        raise ConfigError(
            "model=none: advise finds the loaders that keep a model fed, so it needs one: "
            "model=resnet50 (the article's) on a GPU, or model=resnet18 amp=off on a CPU"
        )
    deadline = started + own["budget_s"]
    job = Job.start(cfg)
    full = prepare_data(cfg, job.world)
    layout = data_layout(cfg.data)
    root = sample_tree(
        full.root,
        full.records,
        own["sample_images"],
        cache_dir(cfg.data.cache_dir),
        layout=layout,
        labels=full.labels,
    )
    base = list(overrides)
    if root != full.root:
        base += _sample_data(root, layout)
    data = prepare_data(compose_run(base), job.world) if root != full.root else full
    ceiling_started = time.perf_counter()
    ceiling = measure_ceiling(base, job, data, own["budget_s"])
    ceiling_s = time.perf_counter() - ceiling_started
    log.info("compute ceiling: %s trains at %.0f images/s on %s", cfg.model, ceiling, job.device)
    names = (
        own["loaders"].split(",")
        if own["loaders"]
        else [name for name in loaders.names() if name != "synthetic"]
    )
    measured = []
    for index, name in enumerate(names):
        share = (deadline - time.perf_counter()) / (len(names) - index)
        if share <= _RUN_S[0]:
            measured.append(Measured(name, note="budget spent before it"))
            continue
        try:
            measured.append(
                measure_loader(name, base, job, data, counts, time.perf_counter() + share, ceiling)
            )
        except FacebenchError as error:
            measured.append(Measured(name, note=f"failed: {error}"))
    return Advice(
        counts=counts,
        model=cfg.model,
        device=str(job.device),
        ceiling=ceiling,
        n_images=len(full.records),
        n_sample=len(data.records),
        measured=measured,
        seconds=time.perf_counter() - started,
        budget_s=own["budget_s"],
        ceiling_s=ceiling_s,
    )


def record(advice: Advice, tracking: bool, out: Path | None = None) -> Path:
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = out or PROJECT_ROOT / "outputs" / "advise" / stamp
    out.mkdir(parents=True, exist_ok=True)
    (out / "advice.md").write_text(advice.markdown(), encoding="utf-8")
    if any(m.rates for m in advice.measured):
        chart(advice, out / "advice.png")
    tracker = Tracker(enabled=tracking, experiment=REPORTS_EXPERIMENT)
    params = {"model": advice.model, "device": advice.device, "n_images": advice.n_images}
    with tracker.run(
        f"advise-{advice.model}-{advice.device}", params, {"facebench.kind": "advise"}
    ):
        tracker.log_metrics(
            {"ceiling_images_per_s": advice.ceiling}
            | {f"{m.name}_images_per_s": m.best()[1] for m in advice.measured if m.rates}
        )
        tracker.log_artifact(out / "advice.md")
        tracker.log_artifact(out / "advice.png")
    return out


def _sample_data(root: Path, layout: Layout) -> list[str]:
    """The data overrides that read a sample tree written by sample_tree."""
    if layout.kind == "folder":
        labels = ["data.labels=labels.csv"] if layout.labels else ["data.labels="]
        return ["data=folder", f"data.root={root}", *labels]
    return ["data=celeba_digiface", f"data.root={root}"]


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return
    configure()
    try:
        own = parse(argv)[1]
        advice = advise(argv)
        tracking = "tracking=false" not in argv
        out = record(advice, tracking, Path(own["out"]) if own["out"] else None)
    except FacebenchError as error:
        log.error("%s", error)
        sys.exit(1)
    sys.stdout.write("\n" + advice.markdown())
    print(f"\n(written to {out})")


if __name__ == "__main__":
    main()
