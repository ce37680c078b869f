"""What reading from an object store cost: requests, bytes, retries, 503s, and each GET's latency
and time to first byte, tallied where the GET is made and carried with the batch (stages.py), so
that an epoch's totals and percentiles come from every worker's requests.

Latencies go into log-spaced buckets (each 1.2 times the one below, from 20 us to about 90 s): a
batch carries two short lists of counts rather than every request's time, tallies from any
number of workers add up, and a percentile is read to within the bucket's 20%.
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

    def add_get(
        self, size: int, latency_ns: int, first_byte_ns: int, retries: int, throttled: int
    ) -> None:
        self.requests += 1
        self.bytes += size
        self.retries += retries
        self.throttled += throttled
        self.latency[bucket(latency_ns)] += 1
        self.first_byte[bucket(first_byte_ns)] += 1

    def add(self, other: Fetches) -> None:
        self.requests += other.requests
        self.bytes += other.bytes
        self.retries += other.retries
        self.throttled += other.throttled
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
        for name, histogram in (("get", self.latency), ("ttfb", self.first_byte)):
            for share in (50, 99):
                value = percentile_ms(histogram, share / 100)
                if value is not None:
                    found[f"storage_{name}_p{share}_ms"] = value
        return found


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
