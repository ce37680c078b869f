"""What reading from an object store cost: requests, bytes, retries, 503s, and each GET's latency
and time to first byte, tallied where the GET is made and carried with the batch (stages.py), so
that an epoch's totals and percentiles come from every worker's requests.

Latencies go into log-spaced buckets (each 1.2 times the one below, from 20 us to about 90 s): a
batch carries two short lists of counts rather than every request's time, tallies from any
number of workers (and ranks) add up, and a percentile is read to within the bucket's 20%. Their
sum is kept exactly beside the buckets: the mean latency, which Little's law needs (the mean
number in flight is the request rate x the MEAN time each takes; a percentile's bucket top would
overstate it by up to 20%, and more for a skewed spread).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

_FIRST_NS = 20_000
_GROWTH = 1.2
BUCKETS = 84  # 20 us x 1.2^84: about 90 s
_LOG_GROWTH = math.log(_GROWTH)


def bucket(ns: int) -> int:
    """The bucket a latency falls in."""
    if ns <= _FIRST_NS:
        return 0
    return min(BUCKETS - 1, int(math.log(ns / _FIRST_NS) / _LOG_GROWTH) + 1)


def bucket_top_ms(index: int) -> float:
    """A bucket's upper bound, in ms: what a percentile falling in it is reported as."""
    return _FIRST_NS * _GROWTH**index / 1e6


# Every metric Fetches.metrics() may give: what a job's pooled fetches replace of a rank's.
FETCH_METRICS = frozenset(
    {
        "storage_requests",
        "storage_bytes",
        "storage_requests_per_s",
        "storage_mb_per_s",
        "storage_retries",
        "storage_throttled",
        "storage_get_mean_ms",
        "storage_ttfb_mean_ms",
    }
    | {f"storage_{name}_p{share}_ms" for name in ("get", "ttfb") for share in (50, 99)}
)


@dataclass(slots=True)
class Fetches:
    """GETs made (and the retries and 503 answers among their attempts), bytes received, and
    the latencies' and first bytes' histograms."""

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    throttled: int = 0  # 503 SlowDown answers, retried or not
    latency: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    first_byte: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    latency_ns: int = 0  # every GET's latency, summed: the mean's numerator
    first_byte_ns: int = 0  # and its time to first byte, summed

    def add_get(
        self, size: int, latency_ns: int, first_byte_ns: int, retries: int, throttled: int
    ) -> None:
        self.requests += 1
        self.bytes += size
        self.retries += retries
        self.throttled += throttled
        self.latency[bucket(latency_ns)] += 1
        self.latency_ns += latency_ns
        self.first_byte[bucket(first_byte_ns)] += 1
        self.first_byte_ns += first_byte_ns

    def add(self, other: Fetches) -> None:
        self.requests += other.requests
        self.bytes += other.bytes
        self.retries += other.retries
        self.throttled += other.throttled
        self.latency_ns += other.latency_ns
        self.first_byte_ns += other.first_byte_ns
        for mine, theirs in ((self.latency, other.latency), (self.first_byte, other.first_byte)):
            for index, count in enumerate(theirs):
                mine[index] += count

    def __bool__(self) -> bool:
        return self.requests > 0 or self.retries > 0

    def metrics(self, epoch_time_s: float) -> dict[str, float]:
        """storage_* metrics of an epoch (none when nothing was fetched: local files)."""
        if not self:
            return {}
        metrics: Mapping[str, float] = {
            "storage_requests": float(self.requests),
            "storage_bytes": float(self.bytes),
            "storage_requests_per_s": self.requests / epoch_time_s if epoch_time_s > 0 else 0.0,
            "storage_mb_per_s": self.bytes / 1e6 / epoch_time_s if epoch_time_s > 0 else 0.0,
            "storage_retries": float(self.retries),
            "storage_throttled": float(self.throttled),
        }
        found = dict(metrics)
        if self.requests:
            found["storage_get_mean_ms"] = self.latency_ns / self.requests / 1e6
            found["storage_ttfb_mean_ms"] = self.first_byte_ns / self.requests / 1e6
        for name, histogram in (("get", self.latency), ("ttfb", self.first_byte)):
            for share in (50, 99):
                value = percentile_ms(histogram, share / 100)
                if value is not None:
                    found[f"storage_{name}_p{share}_ms"] = value
        return found


def requests_in_flight(metrics: Mapping[str, float]) -> float | None:
    """Little's law: the GETs in flight on average over the epoch, its request rate x each
    one's mean latency (storage_requests_per_s x storage_get_mean_ms); None where the run read
    no bucket. Below one, the workers waited for a GET that share of the time."""
    per_s, mean_ms = metrics.get("storage_requests_per_s"), metrics.get("storage_get_mean_ms")
    if per_s is None or mean_ms is None:
        return None
    return per_s * mean_ms / 1000


def percentile_ms(histogram: list[int], share: float) -> float | None:
    """The latency (ms, a bucket's upper bound) below which `share` of the requests fall."""
    total = sum(histogram)
    if total == 0:
        return None
    wanted = share * total
    seen = 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= wanted:
            return bucket_top_ms(index)
    return bucket_top_ms(len(histogram) - 1)
