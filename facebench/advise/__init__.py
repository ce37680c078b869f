"""Which pipeline keeps your device fed, and with how few workers: measured here, in a budget.

    python -m facebench.advise                                  # the synthetic stand-in
    python -m facebench.advise data=celeba_digiface data.root=/data/faces budget_s=600
    python -m facebench.advise model=resnet18 batch_size=256 device=cuda:1
    python -m facebench.advise loaders=[dataset,raw] workers=[1,2]
    python -m facebench.advise --cfg job                        # every key, as train.py's

A Hydra app (conf/advise.yaml, AdviseConfig in facebench/config/schema.py): train.py's keys (data,
model, device, batch_size, ...) and its own: budget_s (300), sample_images (20,000: larger sets
are measured on a subset, linked into the cache), loaders (all that are installed), workers (1,
2, 4, ... up to the cores). The results go to the run's folder (outputs/advise/<time>;
hydra.run.dir=... to choose). Then:

1. the compute ceiling: the model training on one batch made once on the device, timed on a small
   batch first so that it fits its share of the budget (a smaller batch than asked, if need be,
   and the answer says so);
2. for each loader, its shards built (timed apart) and its host-side rate (host_only=true: what a
   GPU run receives) with more and more workers, until it outruns the ceiling;
3. the answer: which loaders keep the device fed and with how few workers, the predicted epoch
   time for the whole set, shard build time and disk, and why each other loader falls short.

The table and a chart are printed and written to the run's folder, and logged as one run of the
`facebench-reports` experiment (tracking=false to skip).

May import: every room below it (run, report and theirs).
"""

from __future__ import annotations

from facebench.advise.answer import Advice
from facebench.advise.measure import Measured, shortfall, worker_counts
from facebench.advise.run import advise, record, run_advise

__all__ = ["Advice", "Measured", "advise", "record", "run_advise", "shortfall", "worker_counts"]
