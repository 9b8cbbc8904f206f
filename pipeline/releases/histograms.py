"""Summing the partitions' sparse histograms (``elements``, ``counts``) of a step: the partials of the
active-set aggregator (:class:`pipeline.releases.aggregators.ActiveSetAggregator`) that a heavy-hitter
release merges before it flags."""

from __future__ import annotations

import numpy as np

__all__ = ["merge_histograms"]

_DENSE_DOMAIN = 1 << 22  # domains up to this size are always merged densely (32 MB of float64)


def merge_histograms(parts: list[dict], domain_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum partial histograms (``elements``, ``counts`` ≥ 1 per part) into sorted distinct support
    ids and their total counts. A dense count over the domain when it is not much larger than the
    elements (O(|X| + m), no sort), else a sort of the elements (O(m log m)); same result."""
    elements = np.concatenate([np.asarray(p["elements"], dtype=np.int64) for p in parts])
    counts = np.concatenate([np.asarray(p["counts"], dtype=np.int64) for p in parts])
    if domain_size <= max(_DENSE_DOMAIN, 4 * elements.size):
        dense = np.bincount(elements, weights=counts, minlength=domain_size)  # sums < 2**53: exact
        support = np.flatnonzero(dense)
        return support, dense[support].astype(np.int64)
    support, inverse = np.unique(elements, return_inverse=True)
    return support, np.bincount(inverse, weights=counts, minlength=support.size).astype(np.int64)
