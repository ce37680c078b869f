"""Each request's emulated time to first byte: a constant, or a tail fitted to a median and a
99th percentile.

A real bucket's first byte is not a constant: half come within the median, and one in a hundred
takes several times as long (the profiles cite their figures: conf/storage/). A log-normal is
fitted to the two: ln(latency) is normal with mean ln(p50) and standard deviation
ln(p99 / p50) / z(0.99). Its mean, what Little's law divides by, is p50 x exp(sigma^2 / 2):
above the median, by 27% for a p99 five times the median.

Sampled per request from a seeded generator, so that two runs of the relay draw the same
sequence (which request gets which draw depends on their order of arrival).
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


class Latency:
    """Times to first byte (seconds), drawn one per request."""

    def __init__(self, p50_ms: float, p99_ms: float = 0.0, seed: int = 0) -> None:
        if p50_ms < 0 or p99_ms < 0 or (p99_ms and p99_ms < p50_ms):
            raise ValueError(f"latency p50 {p50_ms} ms, p99 {p99_ms} ms: need 0 <= p50 <= p99")
        self.p50_s = p50_ms / 1000
        tail = p99_ms > p50_ms > 0
        self.sigma = math.log(p99_ms / p50_ms) / _Z99 if tail else 0.0
        self._random = random.Random(seed)

    @property
    def mean_s(self) -> float:
        return self.p50_s * math.exp(self.sigma**2 / 2)

    def quantile_s(self, share: float) -> float:
        """The latency below which `share` of the draws fall."""
        if not self.sigma:
            return self.p50_s
        return self.p50_s * math.exp(self.sigma * NormalDist().inv_cdf(share))

    def draw_s(self) -> float:
        if not self.sigma:
            return self.p50_s
        return self.p50_s * math.exp(self.sigma * self._random.gauss(0.0, 1.0))
