"""How well an epoch was shuffled, from the order its samples arrived in.

The seed warned that shards must be shuffled thoroughly before writing or convergence suffers; these
two numbers make that visible for every pipeline.
"""

from __future__ import annotations

import math

import numpy as np


def order_corr(ids: np.ndarray) -> float:
    """|Spearman rho| between each sample's canonical position and its arrival position.

    0 for a perfect shuffle (about 1/sqrt(n) by chance), 1 for the canonical order or its reverse.
    """
    n = len(ids)
    if n < 2:
        return float("nan")
    canonical_rank = np.empty(n, dtype=np.float64)
    canonical_rank[np.argsort(ids, kind="stable")] = np.arange(n)
    arrival_rank = np.arange(n, dtype=np.float64)
    return float(abs(np.corrcoef(canonical_rank, arrival_rank)[0, 1]))


def expected_distinct_labels(label_counts: np.ndarray, batch_size: int) -> float:
    """E[distinct labels] in a batch drawn uniformly without replacement from the dataset.

    For each class c with n_c of N samples, P(c absent) = C(N - n_c, b) / C(N, b).
    """
    counts = label_counts[label_counts > 0].astype(np.int64)
    total = int(counts.sum())
    if batch_size > total:
        return float(len(counts))

    def log_choose_ratio(n_other: int) -> float:
        if n_other < batch_size:
            return -math.inf
        return (
            math.lgamma(n_other + 1)
            - math.lgamma(n_other - batch_size + 1)
            - math.lgamma(total + 1)
            + math.lgamma(total - batch_size + 1)
        )

    absent = sum(math.exp(log_choose_ratio(total - int(c))) for c in counts)
    return float(len(counts) - absent)


def batch_label_diversity(batch_labels: list[np.ndarray], label_counts: np.ndarray) -> float:
    """Mean distinct labels per batch over what a perfect shuffle would give: 1 is ideal.

    A pipeline that keeps identities together (files grouped by identity, barely shuffled shards)
    scores well below 1.
    """
    if not batch_labels:
        return float("nan")
    size = len(batch_labels[0])
    expected = expected_distinct_labels(label_counts, size)
    observed = float(np.mean([len(np.unique(labels)) for labels in batch_labels]))
    return observed / expected if expected else float("nan")


def order_metrics(
    ids: list[np.ndarray], labels: list[np.ndarray], label_counts: np.ndarray | None
) -> dict[str, float]:
    """Shuffle quality and repeats, from the sample ids the loader reported."""
    if not ids:
        return {}
    all_ids = np.concatenate(ids)
    metrics = {
        "order_corr": order_corr(all_ids),
        "samples_unique": float(len(np.unique(all_ids))),
    }
    if label_counts is not None:
        metrics["batch_label_diversity"] = batch_label_diversity(labels, label_counts)
    return metrics
