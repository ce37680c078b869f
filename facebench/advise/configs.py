"""advise's own keys beside train.py's, and the train config each measurement composes."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from facebench.config import validate
from facebench.errors import ConfigError
from facebench.paths import PROJECT_ROOT

OWN_KEYS = {"budget_s": 300.0, "sample_images": 20_000, "loaders": "", "workers": "", "out": ""}


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
