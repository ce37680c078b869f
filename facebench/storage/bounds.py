"""The bounds a run from a bucket cannot pass, from its own measurements and the distance it met:
a rate above them is a measurement error, never an answer (which limit held a run: limits.py).

- the distance: Little's law read the other way. A loader that kept N requests in flight on
  average (its rate x each one's measured mean time) could at most have made N every mean
  emulated time to first byte plus a request's transfer at the connection's bandwidth:
  N / (latency + transfer) requests a second, times the images a request brings;
- the request rate: the prefix's GETs a second, times the images a request brings;
- the host's link: its bandwidth over the bytes an image costs.

"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from facebench.fetches import requests_in_flight
from facebench.storage.distance import Distance
from facebench.storage.limits import client_cpu_us, images_per_request, mb_per_request

BEYOND = 1.15  # a rate this far above its lowest bound is a measurement error


@dataclass(frozen=True)
class Bounds:
    """A run's bounds in images/s (0: none set or known), and its client's CPU per GET."""

    distance: float
    request_rate: float
    link: float
    client_ms_per_get: float

    @classmethod
    def of(cls, metrics: Mapping[str, float], distance: Distance) -> Bounds | None:
        """None where the run read no bucket."""
        per_request = images_per_request(metrics)
        if not per_request:
            return None
        in_flight = requests_in_flight(metrics) or 0.0
        latency_ms = metrics.get("storage_emulated_mean_ms", distance.latency_ms)
        size_mb = mb_per_request(metrics)
        transfer_ms = 8 * size_mb / distance.bandwidth_mbps * 1000 if distance.bandwidth_mbps else 0
        per_get_ms = latency_ms + transfer_ms
        near = in_flight / (per_get_ms / 1000) * per_request if per_get_ms > 0 else 0.0
        rate = distance.requests_per_s * per_request
        mb_per_image = size_mb / per_request
        link = distance.total_mbps / 8 / mb_per_image if distance.total_mbps and mb_per_image else 0
        return cls(near, rate, link, client_cpu_us(metrics) * per_request / 1000)

    @property
    def lowest(self) -> float:
        """The tightest bound set (0: none)."""
        return min((bound for bound in (self.distance, self.request_rate, self.link) if bound),
                   default=0.0)  # fmt: skip

    def beyond(self, images_per_s: float) -> bool:
        """Whether a measured rate passes its tightest bound: an error of measurement (the
        timed window missed reads it depended on), not a rate."""
        return bool(self.lowest) and images_per_s > BEYOND * self.lowest

    def metrics(self) -> dict[str, float]:
        found = {
            "storage_bound_distance_images_per_s": self.distance,
            "storage_bound_requests_images_per_s": self.request_rate,
            "storage_bound_link_images_per_s": self.link,
            "storage_client_ms_per_get": self.client_ms_per_get,
        }
        return {name: value for name, value in found.items() if value}
