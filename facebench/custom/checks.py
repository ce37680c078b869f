"""What facebench can check of a user's pipeline, from what its batches carried, and the
warnings where it misbehaves: an IterableDataset that every worker yields whole (PyTorch issue
29804), more samples than its `__len__`, workers whose private memory grows through the epoch
(copy-on-read of the Python objects a dataset holds: PyTorch issue 13246). Its samples
themselves (each once, labels, pixels) cannot be checked: facebench has no records of them."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from facebench.custom.carrier import Carried

log = logging.getLogger(__name__)

# Growth of a worker's private memory, over the epoch, that is said: below it, a decoder's
# buffers and the allocator's arenas settling.
GROWTH_WARN_BYTES = 64 * 2**20


@dataclass
class Observed:
    """One epoch of a user's pipeline, as its batches showed it."""

    name: str  # loader=<name>
    n_workers: int
    iterable: bool  # an IterableDataset: its workers must split it themselves
    length: int | None  # len(dataset), where it has one
    samples: int = 0
    per_worker: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    digests: dict[int, str] = field(default_factory=dict)
    memory: dict[int, list[int]] = field(default_factory=dict)  # worker: [first, last]
    who: str = ""  # how the warnings name the pipeline; "": loader=<name>

    @property
    def said(self) -> str:
        return self.who or f"loader={self.name}"

    def add(self, n: int, carried: Carried | None) -> None:
        self.samples += n
        if carried is None:
            return
        self.per_worker[carried.worker] += n
        if carried.digest:
            self.digests.setdefault(carried.worker, carried.digest)
        if carried.private_bytes >= 0:
            readings = self.memory.setdefault(carried.worker, [carried.private_bytes] * 2)
            readings[1] = carried.private_bytes

    def conclude(self) -> dict[str, float]:
        """The epoch's custom_* metrics; each misbehaviour said in one warning line."""
        metrics = {"custom_samples": float(self.samples)}
        if self.length is not None:
            metrics["custom_dataset_len"] = float(self.length)
        metrics.update(self._sharding())
        metrics.update(self._memory())
        return metrics

    def _sharding(self) -> dict[str, float]:
        copies = max(Counter(self.digests.values()).values(), default=1)
        repeated = self.samples / self.length if self.length and self.samples > self.length else 1.0
        metrics = {"custom_same_start_workers": float(copies if copies > 1 else 0)}
        if copies > 1 and self.iterable:
            log.warning(
                "%s: %d of its %d workers began with the same sample: the "
                "IterableDataset is not split between workers, each yields all of it "
                "(%s samples in the epoch%s). Split it in __iter__ by "
                "torch.utils.data.get_worker_info() (PyTorch issue 29804)",
                self.said,
                copies,
                self.n_workers,
                f"{self.samples:,}",
                f", {repeated:.1f} times its len() of {self.length:,}" if self.length else "",
            )
        elif repeated > 1.0:
            log.warning(
                "%s: the epoch held %s samples, %.1f times its dataset's len() of %s",
                self.said,
                f"{self.samples:,}",
                repeated,
                f"{self.length:,}",
            )
        return metrics

    def _memory(self) -> dict[str, float]:
        if not self.memory:
            return {}
        growth = {worker: last - first for worker, (first, last) in self.memory.items()}
        largest = max(growth.values())
        mean = sum(growth.values()) / len(growth)
        metrics = {
            "worker_private_growth_mb": mean / 2**20,
            "worker_private_growth_max_mb": largest / 2**20,
            "worker_private_mb": max(last for _, last in self.memory.values()) / 2**20,
        }
        if mean >= GROWTH_WARN_BYTES:
            log.warning(
                "%s: each worker's own memory grew by %.0f MiB on average (%.0f MiB at "
                "most) through the epoch: reads that copy the pages of Python objects the "
                "dataset holds (lists of paths, dicts), shared with the main process until "
                "touched (PyTorch issue 13246). Keep them in numpy arrays or one bytes "
                "buffer; with many workers this memory multiplies",
                self.said,
                mean / 2**20,
                largest / 2**20,
            )
        return metrics
