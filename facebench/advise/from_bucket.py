"""What advise says of the requests a loader made to a bucket."""

from __future__ import annotations

import math
from collections.abc import Mapping

from facebench.advise.measure import Measured
from facebench.fetches import requests_in_flight
from facebench.storage.bounds import Bounds
from facebench.storage.distance import Distance
from facebench.storage.latency import Latency
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


def what_it_takes(pace: float, distance: Distance, measured: list[Measured]) -> str:
    """For an accelerator taking `pace` images/s from a bucket at `distance`: the requests in
    flight per-image GETs need (Little's law at the mean latency, tail included), whether one
    prefix's request rate allows them, the shard size past which a connection's bandwidth,
    not the latency, sets a shard's time, and the cores the client's CPU per GET costs, from
    the loaders measured; "" where no distance is emulated."""
    if not distance.latency_ms or pace <= 0:
        return ""
    mean_s = Latency(distance.latency_ms, distance.latency_p99_ms).mean_s
    text = (
        f"From this bucket, an accelerator taking {pace:,.0f} images/s needs, by Little's law, "
        f"{pace * mean_s:,.0f} GETs in flight of one image each at its {mean_s * 1000:,.1f} ms "
        "mean time to first byte (n_workers x storage.requests_per_worker)"
    )
    if distance.requests_per_s:
        fits = pace <= distance.requests_per_s
        text += (
            f"; {pace:,.0f} requests/s {'fit within' if fits else 'exceed'} one prefix's "
            f"{distance.requests_per_s:,.0f}"
            + ("" if fits else ": spread the set over prefixes, or read shards")
        )
    per_image = [m for m in measured if m.rates and m.shard_bytes == 0]
    cpu = [_client_ms(m) for m in per_image if _client_ms(m)]
    if cpu:
        text += (
            f"; the client's CPU, {min(cpu):.2f} ms a GET at best measured here, costs "
            f"{pace * min(cpu) / 1000:,.1f} cores per accelerator"
        )
    shards = [m for m in measured if m.rates and m.shard_bytes]
    mb_per_image = [_mb_per_image(m) for m in shards if _mb_per_image(m)]
    if distance.bandwidth_mbps and mb_per_image:
        per_image_mb = min(mb_per_image)
        connection = distance.bandwidth_mbps / 8  # MB/s
        # Past this size the latency is under a tenth of a shard's fetch.
        size = 9 * mean_s * connection / per_image_mb
        most = connection / per_image_mb
        text += (
            f". Shards of {per_image_mb * 1000:,.0f} kB an image reach a connection's "
            f"{distance.bandwidth_mbps:,.0f} Mbit/s from about {size:,.0f} images a shard (the "
            f"latency then under a tenth of each fetch), {most:,.0f} images/s a connection: "
            f"{max(1, math.ceil(pace / most))} fetching at once per accelerator"
        )
    return text + "."


def _client_ms(measured: Measured) -> float:
    metrics = measured.stages.get(measured.best()[0], {})
    bounds = Bounds.of(metrics, Distance())
    return bounds.client_ms_per_get if bounds else 0.0


def _mb_per_image(measured: Measured) -> float:
    metrics = measured.stages.get(measured.best()[0], {})
    seen = metrics.get("samples_seen", 0.0)
    return metrics.get("storage_bytes", 0.0) / 1e6 / seen if seen else 0.0
