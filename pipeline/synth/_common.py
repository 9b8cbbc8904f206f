"""Shared pieces of the seed-003 synthesizers: argument checks, the categorical consistency
projection, its clamping fallback, and the vectorised "extend records group by group" step.

Everything here is post-processing of already-noisy numbers (or of public synthetic records)
except :func:`coerce_values`, which only validates the curator-side input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.privacy.rng import RandomSource

from pipeline.privacy.accounting import sensitivity_factor as _sensitivity_factor
from pipeline.validation import check_int, check_real  # noqa: F401  (re-exported)

NEIGHBOURS = ("add_remove", "replace")

#: Largest histogram (categories ** window bins) a fixed-window synthesizer accepts. Each step
#: keeps its noisy and projected histograms (int64), so the bound keeps memory per step ≤ 16 MiB.
MAX_BINS = 1 << 20


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------

def check_rho(rho: Any) -> float:
    rho = check_real(rho, "rho")
    if rho <= 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    return rho


def check_beta(beta: Any) -> float:
    beta = check_real(beta, "beta")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return beta


def check_neighbours(neighbours: Any) -> str:
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
    return neighbours


def sensitivity_factor(neighbours: str) -> float:
    """Multiplier on σ² (for a fixed ρ) of one histogram release: add_remove → 1, replace → 2."""
    return float(_sensitivity_factor(check_neighbours(neighbours)))


def coerce_values(values: Any, categories: int, expected_len: int | None, name: str = "values") -> np.ndarray:
    """Validate one step of per-user reports and return them as int64.

    Accepts integer arrays, float arrays whose entries are all integral (e.g. ``1.0``), and bool
    arrays when ``categories == 2``. Raises TypeError/ValueError naming ``name`` otherwise.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array with one value per user, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: at least one user is needed")
    if expected_len is not None and arr.size != expected_len:
        raise ValueError(
            f"{name} has length {arr.size} but the synthesizer has n={expected_len} users "
            "(the roster is fixed by the first step)"
        )
    if arr.dtype == np.bool_:
        if categories != 2:
            raise TypeError(f"{name} is boolean but categories={categories}; pass integer codes")
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.integer):
        bad = (arr < 0) | (arr >= categories)
    elif np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or infinite entries")
        if np.any(arr != np.floor(arr)):
            i = int(np.flatnonzero(arr != np.floor(arr))[0])
            raise ValueError(f"{name} must hold integer category codes; entry {i} is {arr[i]!r}")
        bad = (arr < 0) | (arr >= categories)
    else:
        raise TypeError(f"{name} must be an integer (or integral float) array, got dtype {arr.dtype}")
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [0, {categories}); entry {i} is {arr[i]!r}")
    return arr.astype(np.int64)


def coerce_counts(counts: Any, size: int, name: str) -> np.ndarray:
    """Validate a histogram of counts (non-negative integers, given length) and return int64."""
    arr = np.asarray(counts)
    if arr.ndim != 1 or arr.size != size:
        raise ValueError(f"{name} must be a 1-D array of length {size}, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)):
            raise ValueError(f"{name} must hold non-negative integer counts")
    if np.any(arr < 0):
        raise ValueError(f"{name} must hold non-negative counts")
    return arr.astype(np.int64)


def synthetic_dtype(categories: int) -> np.dtype:
    return np.dtype(np.int8) if categories <= 127 else np.dtype(np.int16)


# --------------------------------------------------------------------------------------------
# categorical consistency projection (Algorithm 1 generalised; DESIGN §2)
# --------------------------------------------------------------------------------------------

def project_children(parents: np.ndarray, noisy: np.ndarray, rng: RandomSource) -> np.ndarray:
    """Integer children counts that sum exactly to their parents.

    ``parents``: shape (G,), P_z = number of synthetic records in group z.
    ``noisy``: shape (G, A), the noisy counts Ĉ_{zc} of the group's A children.

    With D_z = P_z − Σ_c Ĉ_{zc} = q_z·A + r_z (floor division, 0 ≤ r_z < A), every child gets
    Ĉ_{zc} + q_z and r_z children chosen uniformly at random (a uniform r_z-subset) get one more.
    For A = 2 this is the paper's p = Ĉ + Δ_z ± b_z (Algorithm 1, Eqs. 3–4). The result may
    be negative (padding too small); see :func:`clamp_children`.
    """
    groups, a = noisy.shape
    d = parents - noisy.sum(axis=1)
    q = np.floor_divide(d, a)
    r = d - q * a
    out = noisy + q[:, None]
    if a == 2:
        # one uniform bit picks which child gets the extra unit when r = 1
        pick = rng.integers(2, groups)
        extra = np.zeros((groups, 2), dtype=np.int64)
        extra[np.arange(groups), pick] = 1
        out = out + extra * (r[:, None] == 1)
    else:
        keys = rng.random_keys(groups * a).reshape(groups, a)
        ranks = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable")
        out = out + (ranks < r[:, None])
    return out


def clamp_children(target: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, int]:
    """Move rows with a negative entry into {0 ≤ p ≤ P_z, Σ_c p = P_z}; return (counts, #clamped bins).

    Post-processing fallback for the probability-≤β event that the padding is too small.
    Negative entries become 0 and the excess is removed from the largest entries by capping them
    at a common level L ("water-filling from the top"): the smallest change in max-norm among the
    non-negative rows with the right sum that keep the order of the entries. Deterministic, so no
    randomness is consumed (a restored run stays bit-for-bit identical).
    """
    bad_rows = np.flatnonzero((target < 0).any(axis=1))
    if bad_rows.size == 0:
        return target, 0
    out = target.copy()
    clamped = int((target[bad_rows] < 0).sum())
    for z in bad_rows:  # loop over the (rare) bad groups only, never over records
        row = np.maximum(out[z], 0)
        total = int(parents[z])
        srt = np.sort(row)[::-1]  # descending
        # largest integer level L with Σ min(row, L) ≤ total
        lo, hi = 0, int(srt[0]) if srt.size else 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(np.minimum(row, mid).sum()) <= total:
                lo = mid
            else:
                hi = mid - 1
        capped = np.minimum(row, lo)
        deficit = total - int(capped.sum())
        if deficit:
            # the entries above the level, in index order, get one more unit each
            above = np.flatnonzero(row > lo)[:deficit]
            capped[above] += 1
        out[z] = capped
    return out, clamped


def assign_groups(group_codes: np.ndarray, counts: np.ndarray, rng: RandomSource) -> np.ndarray:
    """Random partition of records into labelled parts of prescribed sizes, group by group.

    ``group_codes``: (m,) group index of every record. ``counts``: (G, A) with row sums equal to
    the group sizes. Returns labels (m,) in [0, A): within every group g exactly counts[g, c]
    records get label c, the partition being uniformly random (records are ordered by independent
    uniform 64-bit keys inside their group, then labelled in runs). O(m log m), no Python loop.
    """
    groups, a = counts.shape
    m = group_codes.size
    keys = rng.random_keys(m)
    # Sorted by (group, key) as np.lexsort((keys, group_codes)) would, about twice as fast: a stable
    # sort by key, then a stable (radix, for narrow ints) sort by group keeps key order inside groups.
    order = np.argsort(keys, kind="stable")
    narrow = np.int16 if groups <= np.iinfo(np.int16).max else np.int64
    order = order[np.argsort(group_codes[order].astype(narrow), kind="stable")]
    labels_sorted = np.repeat(np.tile(np.arange(a, dtype=np.int64), groups), counts.ravel())
    if labels_sorted.size != m:
        raise RuntimeError(f"internal error: counts sum to {labels_sorted.size}, expected {m} records")
    labels = np.empty(m, dtype=np.int64)
    labels[order] = labels_sorted
    return labels
