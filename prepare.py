"""Build pre-shuffled shards of the configured data, for loader=pickle.

    python prepare.py                                        # the synthetic default
    python prepare.py data=celeba_digiface data.root=/data/faces shard_size=10000

Running it again with unchanged data and settings does nothing; changes rebuild.
"""

import hydra
from omegaconf import DictConfig

from facebench.run.entry import configure, run_job
from facebench.shards.prepare import run_prepare

configure()


@hydra.main(version_base="1.3", config_path="conf", config_name="prepare")
def main(cfg: DictConfig) -> None:
    run_job(run_prepare, cfg)


if __name__ == "__main__":
    main()
