"""What an epoch costs in dollars, from what a run measured and the prices of conf/cost/.

    prices = Prices.of(cfg.cost, cfg.storage.name, cfg.accelerator.name)
    cost = EpochCost.of(prices, metrics, accelerators=ranks, epoch_images=N)

Per epoch of `epoch_images` (the run's own epoch by default, or a user's whole set: the
requests, bytes and hours scale with the images, and the summary says it scaled them):

- requests: the GETs an image took in the measured epoch (one per image for per-image loaders,
  one per shard for shard loaders), times the images, at the profile's GET price;
- retrieval: the bytes read, at the profile's price a GB (S3 Express One Zone's);
- accelerator-hours: the images over the measured rate (steady where measured), times the
  accelerators fed, at the hour's price; and the share of them the accelerators sat idle
  waiting for data (1 - AU, the emulated accelerators' utilization, or a real GPU's busy share).

A price that is not known (storage=custom, accelerator=none with no cost.gpu_per_hour) leaves
its part out and the total says so; nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GB = 1e9


@dataclass(frozen=True)
class Prices:
    """The prices one run is billed at (None: not known)."""

    get_per_1000: float | None
    put_per_1000: float | None
    list_per_1000: float | None
    retrieval_per_gb: float | None
    upload_per_gb: float | None
    gpu_per_hour: float | None

    @classmethod
    def of(cls, cost: Any, storage: str, accelerator: str = "none") -> Prices:
        """A run's prices: cost.<key> where set, else its storage profile's and accelerator's
        (`cost`: the run's CostConfig, or its DictConfig)."""
        listed = (getattr(cost, "storage", None) or {}).get(storage)
        hour = (getattr(cost, "accelerators", None) or {}).get(accelerator)

        def price(key: str, default: float | None) -> float | None:
            given = getattr(cost, key, None)
            return float(given) if given is not None else default

        def storage_price(key: str) -> float | None:
            return price(key, float(listed.get(key, 0.0)) if listed is not None else None)

        return cls(
            storage_price("get_per_1000"), storage_price("put_per_1000"),
            storage_price("list_per_1000"), storage_price("retrieval_per_gb"),
            storage_price("upload_per_gb"), price("gpu_per_hour", hour),
        )  # fmt: skip


@dataclass(frozen=True)
class EpochCost:
    """One epoch's bill, in dollars (None: a part whose price or measurement is unknown)."""

    epoch_images: int
    measured_images: int
    requests: float
    gigabytes: float
    requests_usd: float | None
    retrieval_usd: float | None
    accelerator_hours: float
    accelerator_usd: float | None
    idle_usd: float | None
    utilization: float | None

    @classmethod
    def of(
        cls,
        prices: Prices,
        metrics: Mapping[str, float],
        accelerators: int = 1,
        epoch_images: int = 0,
    ) -> EpochCost | None:
        """None where the run measured no images."""
        measured = int(metrics.get("samples_seen", 0))
        # The rate the run trusts: its steady one, unless that passed its bucket's bounds
        # (storage_beyond_bounds: the steady window missed its reads), then the whole epoch's.
        steady = (
            None if metrics.get("storage_beyond_bounds") else metrics.get("steady_images_per_s")
        )
        rate = steady or metrics.get("images_per_s", 0.0)
        if measured <= 0 or rate <= 0:
            return None
        images = epoch_images or measured
        scale = images / measured
        requests = metrics.get("storage_requests", 0.0) * scale
        gigabytes = metrics.get("storage_bytes", 0.0) * scale / GB
        hours = images / rate / 3600 * accelerators
        busy = metrics.get("au", metrics.get("gpu_busy_frac"))
        return cls(
            images, measured, requests, gigabytes,
            _times(requests / 1000, prices.get_per_1000) if requests else 0.0,
            _times(gigabytes, prices.retrieval_per_gb) if gigabytes else 0.0,
            hours, _times(hours, prices.gpu_per_hour),
            _times(hours * (1 - busy), prices.gpu_per_hour) if busy is not None else None,
            busy,
        )  # fmt: skip

    @property
    def total_usd(self) -> float | None:
        """The epoch's bill where every part is known (requests, bytes and hours)."""
        parts = (self.requests_usd, self.retrieval_usd, self.accelerator_usd)
        return None if any(part is None for part in parts) else sum(parts)  # type: ignore[misc]

    def metrics(self) -> dict[str, float]:
        found: dict[str, float | None] = {
            "cost_epoch_images": float(self.epoch_images),
            "cost_requests_per_epoch": self.requests,
            "cost_gb_per_epoch": self.gigabytes,
            "cost_requests_usd": self.requests_usd,
            "cost_retrieval_usd": self.retrieval_usd,
            "cost_accelerator_hours": self.accelerator_hours,
            "cost_accelerator_usd": self.accelerator_usd,
            "cost_idle_usd": self.idle_usd,
            "cost_epoch_usd": self.total_usd,
        }
        return {name: value for name, value in found.items() if value is not None}

    def said(self) -> str:
        """One line: the epoch's bill, part by part, and how it was scaled."""
        scaled = (
            f" (scaled from the {self.measured_images:,} measured)"
            if self.epoch_images != self.measured_images
            else ""
        )
        parts = [f"{self.requests:,.0f} GETs {_usd(self.requests_usd)}"] if self.requests else []
        if self.gigabytes and self.retrieval_usd:
            parts.append(f"{self.gigabytes:,.2f} GB retrieved {_usd(self.retrieval_usd)}")
        hours = f"{self.accelerator_hours:,.3g} accelerator-hours {_usd(self.accelerator_usd)}"
        if self.idle_usd is not None and self.utilization is not None:
            hours += f" ({_usd(self.idle_usd)} of it idle: utilization {self.utilization:.0%})"
        parts.append(hours)
        total = self.total_usd
        ending = f"= {_usd(total)}" if total is not None else "(total unknown: a price is not set)"
        return f"one epoch of {self.epoch_images:,} images{scaled}: {' + '.join(parts)} {ending}"


def put_cost(prices: Prices, puts: int, lists: int, gigabytes: float) -> float | None:
    """What uploading a set cost: its PUTs (multipart parts counted), LISTs and bytes in."""
    parts = (
        _times(puts / 1000, prices.put_per_1000),
        _times(lists / 1000, prices.list_per_1000) if lists else 0.0,
        _times(gigabytes, prices.upload_per_gb) if gigabytes else 0.0,
    )
    return None if any(part is None for part in parts) else sum(parts)  # type: ignore[misc]


def _times(amount: float, price: float | None) -> float | None:
    return None if price is None else amount * price


def _usd(value: float | None) -> str:
    if value is None:
        return "$ unknown"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"
