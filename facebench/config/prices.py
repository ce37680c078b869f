"""What a run costs, as config (conf/cost/): the storage's request and retrieval prices per
storage profile, and an accelerator's price per hour, each with its source in the YAML.

Any key set at the top (cost.get_per_1000, cost.gpu_per_hour, ...) replaces the profile's or
the accelerator's figure for this run: `python train.py cost.gpu_per_hour=2.10`. What the prices
make of a run's measurements: facebench/costs.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RequestPrices:
    """A storage class's bill, in US dollars: per 1,000 requests of each kind, and per GB read
    or written (S3 Standard charges neither; S3 Express One Zone both)."""

    get_per_1000: float = 0.0
    put_per_1000: float = 0.0
    list_per_1000: float = 0.0
    retrieval_per_gb: float = 0.0
    upload_per_gb: float = 0.0


# A storage profile's prices, and the keys a run may set at the top of cost.*: those and the hour's.
_PRICES = tuple(field.name for field in dataclasses.fields(RequestPrices))
OVERRIDES = (*_PRICES, "gpu_per_hour")


@dataclass
class CostConfig:
    name: str = "none"
    # Each storage profile's prices (storage=<its name>: RequestPrices' keys, 0 where not
    # given); a profile not listed bills nothing known (storage=custom: give your own with
    # cost.get_per_1000=... and the rest).
    storage: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # One accelerator's price an hour, by accelerator=<its name>.
    accelerators: dict[str, float] = dataclasses.field(default_factory=dict)
    # Set any of these to replace the profile's or the accelerator's figure (null: as listed).
    get_per_1000: float | None = None
    put_per_1000: float | None = None
    list_per_1000: float | None = None
    retrieval_per_gb: float | None = None
    upload_per_gb: float | None = None
    gpu_per_hour: float | None = None
    # The images of one epoch of your set, to price (0: the measured epoch's): the requests
    # and the hours scale with them from the measured epoch, and the run says it scaled them.
    epoch_images: int = 0
    # Where the figures come from, and when they were read.
    source: str = ""


def problems(cost: Any, storage: str) -> list[str]:
    """A cost config's mistakes, one line each naming the key: a negative price, prices for a
    storage profile that conf/storage/ does not hold, request prices for local files."""
    if cost is None:
        return []
    found = []
    priced = {
        **{f"cost.{key}": cost.get(key) for key in OVERRIDES},
        **{f"cost.accelerators.{name}": hour for name, hour in (cost.accelerators or {}).items()},
    }
    for profile, listed in (cost.storage or {}).items():
        if profile not in _profiles():
            found.append(
                f"cost.storage.{profile}: no storage profile is named {profile} (conf/storage/ "
                f"holds {', '.join(sorted(_profiles()))}); price one of those, or set "
                "cost.get_per_1000 and the rest for this run"
            )
        priced.update({f"cost.storage.{profile}.{key}": listed.get(key) for key in listed})
        found += [
            f"cost.storage.{profile}.{key}: no such price (give {', '.join(_PRICES)})"
            for key in listed
            if key not in _PRICES
        ]
    found += [
        f"{key}={value}: a price must be 0 or more (null: as listed)"
        for key, value in priced.items()
        if value is not None and value < 0
    ]
    given = [key for key in OVERRIDES[:-1] if cost.get(key) is not None]
    if storage == "local" and given:
        found.append(
            f"cost.{given[0]}: storage=local makes no requests to price; it prices a bucket's "
            "(storage=s3, s3-express, custom)"
        )
    if (cost.get("epoch_images") or 0) < 0:
        found.append(f"cost.epoch_images={cost.epoch_images}: 0 (the measured epoch) or more")
    return found


def _profiles() -> set[str]:
    """The storage profiles conf/storage/ holds (storage=<name>)."""
    folder = Path(__file__).resolve().parents[2] / "conf" / "storage"
    return {path.stem for path in folder.glob("*.yaml")}
