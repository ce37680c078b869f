"""What holds a loader back when it reads a bucket, in words: the request rate, the host's link,
each connection's bandwidth, the latency, the endpoint itself, or none of these (its workers'
CPU: then the costliest stage speaks, facebench/stages.py).

From one run's metrics (storage_* from facebench/fetches.py, stage_* from facebench/stages.py,
storage_relay_* from the relay) and the distance asked for. Little's law gives the requests in
flight (fetches.requests_in_flight: requests a second x each one's mean time). A loader whose
workers wait more than they compute is held by the storage; which limit, is the first of these
it meets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from facebench.fetches import requests_in_flight
from facebench.host.resources import worker_cores
from facebench.stage_metrics import BUILT_IN_STAGES, WORKER_STAGES
from facebench.storage.distance import Distance

BUSY = 0.75  # workers busy this share of their cores' time or more: bound by their CPU
NEAR = 0.9  # a rate this close to its limit is held by it
LATE = 0.5  # this share of answers after the emulated latency: the endpoint set the time


@dataclass(frozen=True)
class Limit:
    """A limit that held a run back: a short name with its numbers ("latency: 16 in flight of
    42 ms"), the whole of it, with what raises it, and its kind (one of KINDS)."""

    short: str
    detail: str
    kind: str = "the distance"


# What can hold a run from a bucket back, as the run's storage_held_by tag names it.
KINDS = (
    "the request rate", "the host's link", "the relay", "the endpoint", "the distance",
    "the client's CPU", "the decode", "the transform", "the collate",
)  # fmt: skip


def holding_back(
    metrics: Mapping[str, float],
    images_per_s: float,
    distance: Distance,
    workers: int,
    cores: int,
    ranks: int = 1,
) -> Limit | None:
    """The limit that holds a run from a bucket back; None where it read no bucket, or its
    workers' CPU is the bound or unknown. `images_per_s` and `workers` are the whole job's
    (`ranks` ranks on this host, each spinning its accelerator's wait)."""
    per_request = images_per_request(metrics)
    if not per_request or images_per_s <= 0:
        return None
    per_s = images_per_s / per_request  # at the steady rate, where the epoch's includes start-up
    shared = _shared_limit(metrics, per_s, distance)
    if shared is not None:
        return shared
    cpu_us = metrics.get("stage_worker_cpu_us")
    if cpu_us is None:  # workers not broken down (DALI's threads): their CPU could be the bound
        return None
    # The cores the workers could have: an emulated accelerator's spinning wait keeps some (up
    # to a whole core, accelerator.host_cpu).
    spun = metrics.get("accelerator_host_cpu_s", 0.0) / max(1e-9, metrics.get("epoch_time_s", 0.0))
    free = max(0.5, worker_cores(cores, ranks, spun))
    if images_per_s * cpu_us / 1e6 >= BUSY * min(max(1, workers), free):
        return None
    return _waited_for(metrics, per_s, per_request, distance)


def _shared_limit(metrics: Mapping[str, float], per_s: float, distance: Distance) -> Limit | None:
    """A limit every request meets whatever the workers do: the prefix's rate, the host's link,
    the relay's one core."""
    # The same 503s, seen by the relay (all of them) and by the clients (those they report).
    refused = max(metrics.get("storage_relay_503s", 0.0), metrics.get("storage_throttled", 0.0))
    if distance.requests_per_s and (refused or per_s >= NEAR * distance.requests_per_s):
        said = f"the request rate: {per_s:,.0f} of {distance.requests_per_s:,.0f} requests/s"
        return Limit(
            said,
            f"{said}, the most the prefix allows ({refused:,.0f} answered 503 SlowDown)",
            "the request rate",
        )
    mbit = 8 * metrics.get("storage_mb_per_s", 0.0)
    if distance.total_mbps and mbit >= NEAR * distance.total_mbps:
        said = f"the host's link: {mbit:,.0f} of its {distance.total_mbps:,.0f} Mbit/s"
        return Limit(said, said, "the host's link")
    if metrics.get("storage_relay_cpu_frac", 0.0) >= NEAR:
        return Limit(
            "the relay emulating the distance",
            "the relay emulating the distance (it kept its one core busy): the loader may be "
            "faster than this says",
            "the relay",
        )
    return None


def _waited_for(
    metrics: Mapping[str, float], per_s: float, per_request: float, distance: Distance
) -> Limit | None:
    """What idle workers waited for: the endpoint, the relay, a connection's bandwidth, or
    latency."""
    late = metrics.get("storage_relay_late_frac", 0.0)
    if (
        distance.latency_ms
        and late >= LATE
        and metrics.get("storage_relay_endpoint_frac", 1) >= LATE
    ):
        return Limit(
            "the endpoint itself",
            f"the endpoint itself: it answered {late:.0%} of the requests after the emulated "
            f"latency (in {metrics.get('storage_relay_endpoint_ms', 0.0):,.0f} ms on average): "
            "this measures the server here more than the distance",
            "the endpoint",
        )
    if distance.latency_ms and late >= LATE:  # answered from the copy, after their time
        why = (
            "under real-time scheduling, behind its own work (it kept "
            f"{metrics.get('storage_relay_cpu_frac', 0.0):.0%} of its one core busy)"
            if metrics.get("storage_relay_realtime", 1.0)
            else "without real-time scheduling, it waited for a core behind the loader's "
            "workers (storage.realtime, ulimit -r)"
        )
        return Limit(
            "the relay emulating the distance",
            f"the relay emulating the distance: {late:.0%} of its answers left after their "
            f"emulated time, {why}: the loader may be faster than this says",
            "the relay",
        )
    size_mb = mb_per_request(metrics)
    transfer_ms = 8 * size_mb / distance.bandwidth_mbps * 1000 if distance.bandwidth_mbps else 0
    if transfer_ms and transfer_ms >= distance.latency_ms:
        return Limit(
            f"each connection's bandwidth ({transfer_ms:,.0f} ms a request)",
            f"each connection's bandwidth: a request's {size_mb:,.1f} MB takes {transfer_ms:,.0f} "
            f"ms at {distance.bandwidth_mbps:,.0f} Mbit/s, beyond its {distance.latency_ms:g} ms "
            "latency; more requests in flight raise it",
        )
    in_flight, mean_ms = requests_in_flight(metrics), metrics.get("storage_get_mean_ms")
    if in_flight is None or mean_ms is None:
        return None
    endpoint_ms = metrics.get("storage_relay_endpoint_ms")
    # Where a relay emulates the latency, how much of each request the endpoint itself took.
    own = (
        f", the endpoint's own answer {endpoint_ms:,.0f} ms of it on average" if endpoint_ms else ""
    )
    shown = f"{in_flight:,.0f}" if in_flight >= 10 else f"{in_flight:.1f}"
    requests_said = f"{shown} request{'' if shown == '1.0' else 's'}"
    return Limit(
        f"latency ({requests_said} in flight of {mean_ms:,.0f} ms)",
        f"latency: about {requests_said} in flight of {mean_ms:,.0f} ms each (the mean{own}), "
        f"{per_s:,.0f} requests/s of {count(per_request)} images; more in flight (n_workers, "
        "and storage.requests_per_worker for loaders that read each image) or more images a "
        "request (shards) raise it",
    )


def held_by(
    metrics: Mapping[str, float],
    images_per_s: float,
    distance: Distance,
    workers: int,
    cores: int,
    ranks: int = 1,
) -> str | None:
    """Which of KINDS held a run from a bucket: a storage limit (holding_back), or, where its
    workers were the bound, their costliest stage (the read stage's CPU is the client's); None
    where the run read no bucket or its workers are not broken down."""
    limit = holding_back(metrics, images_per_s, distance, workers, cores, ranks)
    if limit is not None:
        return limit.kind
    stages = {name: metrics.get(f"stage_{name}_cpu_us") for name in BUILT_IN_STAGES}
    if not images_per_request(metrics) or None in stages.values():
        return None
    stages["read"] = client_cpu_us(metrics)
    costliest = max(stages, key=lambda name: stages[name] or 0.0)
    return "the client's CPU" if costliest == "read" else f"the {costliest}"


def client_cpu_us(metrics: Mapping[str, float]) -> float:
    """The S3 client's CPU per image: its read stage's, and the workers' CPU outside every
    stage, which is the client's own threads' (the CRT client's event loop, the GET pool's,
    LitData's downloader), not the stage thread's."""
    stages = sum(metrics.get(f"stage_{name}_cpu_us", 0.0) for name in WORKER_STAGES)
    outside = max(0.0, metrics.get("stage_worker_cpu_us", 0.0) - stages)
    return metrics.get("stage_read_cpu_us", 0.0) + outside


def hosts_allowed(
    metrics: Mapping[str, float], distance: Distance, pace: float
) -> tuple[int, str] | None:
    """How many accelerators (each taking `pace` images/s) the distance's shared limits feed,
    whatever the host: the prefix's request rate and the host's link, which every rank shares;
    None where neither is set or the run read no bucket."""
    per_request = images_per_request(metrics)
    if not per_request or pace <= 0:
        return None
    found = []
    if distance.requests_per_s:
        most = math.floor(distance.requests_per_s * per_request / pace)
        found.append(
            (most, f"the prefix's {distance.requests_per_s:,.0f} requests/s, "
                   f"{count(per_request)} images a request")
        )  # fmt: skip
    mb_per_image = metrics["storage_bytes"] / 1e6 / metrics["samples_seen"]
    if distance.total_mbps and mb_per_image:
        most = math.floor(distance.total_mbps / 8 / mb_per_image / pace)
        found.append((most, f"the host's {distance.total_mbps:,.0f} Mbit/s link"))
    return min(found) if found else None


def images_per_request(metrics: Mapping[str, float]) -> float:
    """Images delivered per GET (1 for a per-image loader, thousands for shards); 0 where the
    run read no bucket."""
    requests, seen = metrics.get("storage_requests", 0.0), metrics.get("samples_seen", 0.0)
    return seen / requests if requests and seen else 0.0


def mb_per_request(metrics: Mapping[str, float]) -> float:
    """Megabytes a GET brought on average (a request's size, which a connection's bandwidth
    sends); 0 where the run read no bucket."""
    requests = metrics.get("storage_requests", 0.0)
    return metrics.get("storage_bytes", 0.0) / requests / 1e6 if requests else 0.0


def count(value: float) -> str:
    """'1', '0.75', '1,500': a count of images, as precise as it is worth."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"
