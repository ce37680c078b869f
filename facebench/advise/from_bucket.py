"""What advise says of the requests a loader made to a bucket."""

from __future__ import annotations

from collections.abc import Mapping

from facebench.fetches import requests_in_flight
from facebench.storage.limits import Limit, count, images_per_request, mb_per_request

# Fewer GETs than this in a measurement (a few large shards): no rate or requests in flight is
# read from them.
FEW_REQUESTS = 100


def in_flight(
    metrics: Mapping[str, float], rate: float, requests_per_worker: int, limit: Limit | None
) -> str:
    """From a bucket: the requests a loader keeps in flight at `rate` images/s (Little's law,
    fetches.requests_in_flight), and `limit`, what holds it back beyond its pace; "" where its
    metrics read no bucket."""
    per_request = images_per_request(metrics)
    flying, mean_ms = requests_in_flight(metrics), metrics.get("storage_get_mean_ms")
    if not per_request or flying is None or mean_ms is None:
        return ""
    requests = metrics["storage_requests"]
    if requests < FEW_REQUESTS:  # too few for a rate: what they were
        size = mb_per_request(metrics)
        return (
            f" From the bucket it made {requests:,.0f} requests of {size:,.1f} MB "
            f"({count(per_request)} images each, {mean_ms:,.0f} ms on average)."
        )
    text = (
        f" From the bucket it keeps about {flying:,.0f} requests in flight "
        f"({rate / per_request:,.0f} requests/s of {count(per_request)} images, {mean_ms:,.0f} "
        f"ms each on average; storage.requests_per_worker={requests_per_worker})"
    )
    return text + (f"; beyond its pace it is held back by {limit.short}." if limit else ".")
