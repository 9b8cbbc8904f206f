"""Distinct values of integer arrays whose values span a small range (steps, id lengths), by
counting (``np.bincount``) instead of sorting (``np.unique``, which also imports ``numpy.ma`` on
its first call: ~0.1 s of CPU in a fresh process).
"""

from __future__ import annotations

import numpy as np

__all__ = ["distinct", "value_counts"]

_SPAN = 1 << 16  # widest range counted; a wider one is sorted


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (as ``np.unique(values)``)."""
    return _counted(np.asarray(values))[0]


def value_counts(
    values: np.ndarray, bounds: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct values ascending, index of each one's first occurrence, its count): as
    ``np.unique(values, return_index=True, return_counts=True)``. ``bounds``: the values' (lowest,
    highest), when known already (not computed again)."""
    values = np.asarray(values)
    found, counts = _counted(values, bounds)
    if counts is None:
        return np.unique(values, return_index=True, return_counts=True)
    if found.size == 1:
        return found, np.zeros(1, dtype=np.int64), counts
    first = np.array([int(np.argmax(values == v)) for v in found.tolist()], dtype=np.int64)
    return found, first, counts


def _counted(
    values: np.ndarray, bounds: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """(distinct values, their counts; None when the range was too wide to count)."""
    if not values.size:
        return values[:0], np.zeros(0, dtype=np.int64)
    low, high = bounds if bounds is not None else (int(values.min()), int(values.max()))
    if low == high:  # the common case: one step, ids of one length
        return values[:1].copy(), np.array([values.size])
    if high - low >= _SPAN:
        return np.unique(values), None
    counts = np.bincount((values - low).astype(np.int64), minlength=high - low + 1)
    found = np.flatnonzero(counts)
    return (found + low).astype(values.dtype), counts[found]
