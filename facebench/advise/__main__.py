"""python -m facebench.advise: see facebench/advise/__init__.py; `--help` and `--cfg job` work
as train.py's do."""

import hydra
from omegaconf import DictConfig

from facebench.advise.run import run_advise
from facebench.host.paths import PROJECT_ROOT
from facebench.run.entry import configure, run_job

configure()


@hydra.main(version_base="1.3", config_path=str(PROJECT_ROOT / "conf"), config_name="advise")
def main(cfg: DictConfig) -> None:
    advice, out = run_job(run_advise, cfg)
    print("\n" + advice.markdown())  # the answer itself, as the command's output
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
