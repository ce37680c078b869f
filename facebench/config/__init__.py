"""The config layer: the typed schema of every Hydra config group (schema.py), the keys' fixed
choices (choices.py), and the checks a type cannot make (checks.py). Every other layer reads its
settings from here, by these names.

May import: errors (and nothing else of facebench's: every layer stands on this one).
"""

from facebench.config.checks import typed
from facebench.config.choices import (
    Amp,
    Answers,
    CacheMode,
    Crop,
    DataLayout,
    Decoder,
    Model,
    OnBadSample,
    ParquetMode,
    Sync,
    Workers,
    choice,
)
from facebench.config.schema import (
    AcceleratorConfig,
    AdviseConfig,
    CommonConfig,
    DataConfig,
    DistanceConfig,
    LoaderConfig,
    PrepareConfig,
    StorageConfig,
    TrainConfig,
    TransformConfig,
    register_configs,
)

__all__ = [
    "AcceleratorConfig",
    "AdviseConfig",
    "Amp",
    "Answers",
    "CacheMode",
    "CommonConfig",
    "Crop",
    "DataConfig",
    "DataLayout",
    "Decoder",
    "DistanceConfig",
    "LoaderConfig",
    "Model",
    "OnBadSample",
    "ParquetMode",
    "PrepareConfig",
    "StorageConfig",
    "Sync",
    "TrainConfig",
    "TransformConfig",
    "Workers",
    "choice",
    "register_configs",
    "typed",
]
