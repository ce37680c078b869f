"""Time one epoch of a data-loading pipeline feeding AMP ResNet-50, and record it in MLflow.

    python train.py                                          # synthetic data, loader=dataset
    python train.py -m loader=dataset,datapipe,pickle n_workers=5,10
    python train.py data=celeba_digiface data.root=/data/faces loader=pickle
    python train.py model=none                               # loader only (CPU comparisons)

Then `mlflow ui --backend-store-uri sqlite:///mlflow.db` to compare the runs.
"""

import math

import hydra
from omegaconf import DictConfig

from facebench.run.entry import configure, run_job
from facebench.run.runner import run_training

configure()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    metrics = run_job(run_training, cfg)  # None: a sweep's job failed, and its summary says so
    return metrics["images_per_s"] if metrics else math.nan


if __name__ == "__main__":
    main()
