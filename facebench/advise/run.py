"""advise's run: data and its sample, the ceiling, each loader in turn, within the budget."""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig

from facebench import loaders, printable
from facebench.advise.answer import Advice
from facebench.advise.ceiling import measure_ceiling
from facebench.advise.chart import chart
from facebench.advise.configs import compose_run, parse
from facebench.advise.measure import RUN_S, Measured, measure_loader, worker_counts
from facebench.data.sample import sample_tree
from facebench.data.sources import Layout
from facebench.errors import ConfigError, FacebenchError
from facebench.jobs import configure
from facebench.paths import PROJECT_ROOT, cache_dir, data_layout
from facebench.runner import Data, Job, prepare_data
from facebench.tracking import REPORTS_EXPERIMENT, Tracker

log = logging.getLogger("facebench.advise")

CEILING_SHARE = 0.15  # of the budget, at most, for the compute ceiling


def advise(argv: list[str]) -> Advice:
    """Measure the ceiling, then each loader, within budget_s; the answer."""
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
    base, data = _sampled(cfg, overrides, full, job, own["sample_images"])
    share = min(CEILING_SHARE * own["budget_s"], deadline - time.perf_counter())
    ceiling = measure_ceiling(base, job, data, share)
    log.info(
        "compute ceiling: %s trains at %.0f images/s on %s%s",
        cfg.model,
        ceiling.images_per_s,
        job.device,
        ceiling.note(),
    )
    names = own["loaders"].split(",") if own["loaders"] else loaders.names(real_only=True)
    measured = _each_loader(names, base, job, data, counts, deadline, ceiling.images_per_s)
    return Advice(
        counts=counts,
        model=cfg.model,
        device=str(job.device),
        ceiling=ceiling.images_per_s,
        n_images=len(full.records),
        n_sample=len(data.records),
        measured=measured,
        seconds=time.perf_counter() - started,
        budget_s=own["budget_s"],
        ceiling_s=ceiling.seconds,
        ceiling_note=ceiling.note(),
    )


def _sampled(
    cfg: DictConfig, overrides: list[str], full: Data, job: Job, sample_images: int
) -> tuple[list[str], Data]:
    """The overrides and the data advise measures with: the data itself, or a sample of it
    linked into the cache when it is larger than sample_images."""
    layout = data_layout(cfg.data)
    cache = cache_dir(cfg.data.cache_dir)
    root = sample_tree(
        full.root, full.records, sample_images, cache, layout=layout, labels=full.labels
    )
    if root == full.root:
        return list(overrides), full
    base = [*overrides, *_sample_data(root, layout)]
    return base, prepare_data(compose_run(base), job.world)


def _each_loader(
    names: list[str],
    base: list[str],
    job: Job,
    data: Data,
    counts: list[int],
    deadline: float,
    ceiling: float,
) -> list[Measured]:
    """Each loader in turn, in an equal share of the time left."""
    measured = []
    for index, name in enumerate(names):
        share = (deadline - time.perf_counter()) / (len(names) - index)
        if share <= RUN_S[0]:
            measured.append(Measured(name, note="budget spent before it"))
            continue
        try:
            end = time.perf_counter() + share
            measured.append(measure_loader(name, base, job, data, counts, end, ceiling))
        except FacebenchError as error:
            measured.append(Measured(name, note=f"failed: {error}"))
    return measured


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
    printable.install()
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        import facebench.advise

        print(facebench.advise.__doc__)
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
