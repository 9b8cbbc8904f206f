"""Post-processing of the synthesizers of Bun, Gaboardi, Neunhoeffer & Zhang (arXiv 2306.07884):
the categorical consistency projection, its clamping fallback, the vectorised "extend records
group by group" step, and the dtype of a synthetic column.

Everything here is post-processing of already-noisy numbers (or of public synthetic records).
"""

from __future__ import annotations

import numpy as np

from pipeline.privacy.rng import RandomSource

__all__ = ["synthetic_dtype", "project_children", "clamp_children", "assign_groups"]


def synthetic_dtype(categories: int) -> np.dtype:
    """The smallest signed integer type holding the codes 0..categories−1 and the −1 a consumer uses
    for "not yet released": int8 up to 128 categories, int16 up to 32,768, else int32."""
    for dtype in (np.int8, np.int16, np.int32):
        if categories - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"{categories} categories do not fit a synthetic column")


# --------------------------------------------------------------------------------------------
# categorical consistency projection (Algorithm 1 generalised; docs/synthesizers.md §3)
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


#: :func:`assign_groups` loops over the groups (one selection each) when there are at least this
#: many records per group on average, and otherwise sorts all records at once: each pass of the
#: loop costs a few microseconds of fixed overhead, which below about a hundred records per group
#: exceeds what the sort of 64-bit keys costs.
PARTITION_MIN_GROUP_SIZE = 128


def assign_groups(group_codes: np.ndarray, counts: np.ndarray, rng: RandomSource) -> np.ndarray:
    """Random partition of records into labelled parts of prescribed sizes, group by group.

    This is the random label assignment inside each group of Bun et al. 2024 (continual synthetic data):
    Algorithm 1 appends value c to p_{zc} records of group z chosen uniformly at random, and
    Algorithm 2 appends a 1 to ẑ_b^t records of synthetic weight b − 1 chosen uniformly at random.

    ``group_codes``: (m,) group index of every record, in [0, G). ``counts``: (G, A) with row sums
    equal to the group sizes. Returns labels (m,) in [0, A): within every group g exactly
    counts[g, c] records get label c. Every record draws an independent uniform 64-bit key (one
    ``rng.random_keys(m)`` call); within group g the records whose key ranks lie in
    [Σ_{c'<c} counts[g, c'], Σ_{c'≤c} counts[g, c']) get label c. The partition is uniformly
    random exactly conditional on no tie among the keys (a tie has probability below m²/2^65). A
    tie is broken arbitrarily by the selection (by record index in the sort fallback); the label
    counts stay exact regardless.

    With at least :data:`PARTITION_MIN_GROUP_SIZE` records per group on average, the records are
    ordered by group only (a radix sort of narrow ints) and each group is split at its label
    boundaries by a multi-kth ``np.argpartition`` of its keys: O(m) expected per step for a bounded
    number of groups (plus a Python loop over the groups). With smaller groups, one sort of all
    records by (group, key), O(m log m). For distinct keys both give the same labels.
    RuntimeError if the counts do not match the groups' sizes.
    """
    m = group_codes.size
    keys = rng.random_keys(m)
    if m >= PARTITION_MIN_GROUP_SIZE * counts.shape[0]:
        return _assign_groups_partitioned(group_codes, counts, keys)
    return _assign_groups_sorted(group_codes, counts, keys)


def _group_runs(group_codes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels in runs, group sizes): the labels of the records listed by (group, key rank)."""
    groups, a = counts.shape
    m = group_codes.size
    labels_sorted = np.repeat(np.tile(np.arange(a, dtype=np.int64), groups), counts.ravel())
    if labels_sorted.size != m:
        raise RuntimeError(
            f"internal error: counts sum to {labels_sorted.size}, expected {m} records"
        )
    sizes = np.bincount(group_codes, minlength=groups) if m else np.zeros(groups, dtype=np.int64)
    if sizes.size != groups or np.any(sizes != counts.sum(axis=1)):
        raise RuntimeError("internal error: the counts' row sums differ from the groups' sizes")
    return labels_sorted, sizes


def _group_order(group_codes: np.ndarray, groups: int) -> np.ndarray:
    """Stable order of the records by group (radix sort for int16 codes)."""
    narrow = np.int16 if groups <= np.iinfo(np.int16).max else np.int64
    return np.argsort(group_codes.astype(narrow), kind="stable")


def _assign_groups_sorted(
    group_codes: np.ndarray, counts: np.ndarray, keys: np.ndarray
) -> np.ndarray:
    """Labels from one sort of the records by (group, key); ties in key broken by record index."""
    groups = counts.shape[0]
    labels_sorted, _ = _group_runs(group_codes, counts)
    # Sorted by (group, key) as np.lexsort((keys, group_codes)) would, about twice as fast: a stable
    # sort by key, then a stable (radix, for narrow ints) sort by group keeps key order inside groups.
    order = np.argsort(keys, kind="stable")
    order = order[_group_order(group_codes[order], groups)]
    labels = np.empty(group_codes.size, dtype=np.int64)
    labels[order] = labels_sorted
    return labels


def _assign_groups_partitioned(
    group_codes: np.ndarray, counts: np.ndarray, keys: np.ndarray
) -> np.ndarray:
    """Labels from ordering the records by group, then selecting key ranks group by group.

    After ``np.argpartition(k, kth)`` with every interior label boundary in ``kth``, the positions
    between two consecutive boundaries hold exactly the records whose key ranks lie between them
    (in some order), so labelling by position gives the sort's labels when the keys are distinct.
    """
    groups = counts.shape[0]
    labels_sorted, sizes = _group_runs(group_codes, counts)
    labels = np.empty(group_codes.size, dtype=np.int64)
    order = _group_order(group_codes, groups)
    ends = np.cumsum(sizes).tolist()
    bounds = np.cumsum(counts, axis=1)[:, :-1].tolist()  # label boundaries inside each group
    start = 0
    for g, end in enumerate(ends):
        size = end - start
        if size:
            idx = order[start:end]
            kth = sorted({b for b in bounds[g] if 0 < b < size})
            if kth:
                idx = idx[np.argpartition(keys[idx], kth)]
                labels[idx] = labels_sorted[start:end]
            else:  # a single label for the whole group
                labels[idx] = labels_sorted[start]
        start = end
    return labels
