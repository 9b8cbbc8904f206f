"""Queries on longitudinal panels, real or synthetic (the query families of Bun et al. 2024), vectorised.

A panel is an ``(rows, T)`` integer array with values in ``[0, categories)``; column ``t - 1`` is
step ``t`` (steps are 1-based throughout, as in the paper and the release manifests).

Window patterns
    The length-``k`` window ending at step ``t`` (``t ≥ k``) of a record is the string
    ``(x^{t-k+1}, ..., x^t)``. It is encoded as the integer
    ``code = Σ_j x^{t-k+1+j} · A^{k-1-j}`` (oldest value most significant, A = ``categories``),
    so for A = 2 the code of ``(0, 1, 1)`` is ``0b011 = 3``. :func:`window_histogram` counts codes.

Debiasing synthetic data from the fixed-window synthesizer (Algorithm 1)
    The synthesizer targets the histogram of the *padded* data: n real records plus ``n_pad``
    fake records for every one of the ``A^k`` length-k patterns, at every step t ≥ k (Section 3.1,
    Theorem 3.2: ``p_s^t ≈ C_s^t + n_pad``). ``n_pad`` and ``n`` are public (``n_pad`` is in the
    release manifest, ``n`` is the roster size), so the padding's contribution can be removed
    exactly for any query that is a linear combination of pattern counts:

    * a query ``q`` given as a set of length-k patterns (e.g. "at least 2 of 3 months in
      poverty" = {011, 101, 110, 111}) has count ``Σ_{s∈q} p_s^t`` on the synthetic panel;
      the padding contributes exactly ``n_pad · |q|`` of it, so the debiased count is
      ``Σ_{s∈q} p_s^t − n_pad · |q|`` and the debiased proportion divides that by **n**
      (the real population), not by the synthetic size ``m = n + A^k · n_pad + noise``;
    * a query on a shorter window k' ≤ k is a sum of length-k patterns: each length-k' pattern
      extends to ``A^(k − k')`` length-k patterns, so the padding contributes
      ``n_pad · A^(k − k')`` per length-k' pattern (pass ``synth_window=k``).

    The raw answer a naive analyst gets, ``Σ_{s∈q} p_s^t / m``, is biased towards
    ``|q| / A^k`` by the padding. The functions below take ``(panel, n_pad=0, n=None)``:
    with the defaults they answer the query on the panel as it is (raw), with the synthesizer's
    ``n_pad`` and the real ``n`` they answer it debiased.

Cumulative queries (Algorithm 2)
    ``S_b^t = #{i : x_i^1 + ... + x_i^t ≥ b}`` for binary panels, for every t.
    The cumulative synthesizer outputs exactly n records and no padding: divide by n.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.validation import check_int

__all__ = [
    "QUARTERLY_QUANTITIES",
    "pattern_digits",
    "pattern_mask",
    "window_codes",
    "window_histogram",
    "window_histograms",
    "padding_per_pattern",
    "pattern_query",
    "quarterly_masks",
    "quarterly_poverty",
    "cumulative_counts",
    "cumulative_at_least",
    "window_max_error",
]

# The four quarterly poverty quantities of Bun et al. 2024, Section 5 (window k = 3 months).
QUARTERLY_QUANTITIES: tuple[tuple[str, str], ...] = (
    ("at_least_1", "≥1 month in poverty"),
    ("at_least_2", "≥2 months in poverty"),
    ("at_least_2_consecutive", "≥2 consecutive months"),
    ("all", "all months in poverty"),
)


def _as_panel(panel, name: str = "panel") -> np.ndarray:
    arr = np.asarray(panel)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-d (records, steps) array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer) and arr.dtype != bool:
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr


def pattern_digits(k: int, categories: int = 2) -> np.ndarray:
    """``(A^k, k)`` array: row ``code`` holds the pattern's values, oldest first."""
    k = check_int(k, "k", low=1)
    categories = check_int(categories, "categories", low=2)
    codes = np.arange(categories**k)
    powers = categories ** np.arange(k - 1, -1, -1)
    return (codes[:, None] // powers[None, :]) % categories


def pattern_mask(
    k: int, predicate: Callable[[np.ndarray], np.ndarray], categories: int = 2
) -> np.ndarray:
    """Boolean mask over the ``A^k`` pattern codes: ``predicate`` gets the ``(A^k, k)`` digit array
    (see :func:`pattern_digits`) and returns one boolean per row."""
    digits = pattern_digits(k, categories)
    mask = np.asarray(predicate(digits), dtype=bool)
    if mask.shape != (digits.shape[0],):
        raise ValueError(
            f"predicate must return one boolean per pattern ({digits.shape[0]}), got shape {mask.shape}"
        )
    return mask


def window_codes(panel, t: int, k: int, categories: int = 2) -> np.ndarray:
    """Pattern code of every record's length-k window ending at step t (1-based, k ≤ t ≤ T)."""
    x = _as_panel(panel)
    k = check_int(k, "k", low=1)
    categories = check_int(categories, "categories", low=2)
    t = check_int(t, "t", low=k)
    if t > x.shape[1]:
        raise ValueError(f"t={t} is beyond the panel's {x.shape[1]} steps")
    window = x[:, t - k : t].astype(np.int64)
    if window.size and (window.min() < 0 or window.max() >= categories):
        raise ValueError(f"panel values must lie in [0, categories={categories})")
    powers = categories ** np.arange(k - 1, -1, -1, dtype=np.int64)
    return window @ powers


def window_histogram(panel, t: int, k: int, categories: int = 2) -> np.ndarray:
    """Counts of the ``A^k`` length-k patterns among the windows ending at step t."""
    return np.bincount(window_codes(panel, t, k, categories), minlength=categories**k)


def window_histograms(panel, k: int, categories: int = 2) -> np.ndarray:
    """``(T - k + 1, A^k)`` pattern counts; row ``r`` is the window ending at step ``t = k + r``."""
    x = _as_panel(panel)
    k = check_int(k, "k", low=1)
    if k > x.shape[1]:
        raise ValueError(f"k={k} exceeds the panel's {x.shape[1]} steps")
    return np.stack([window_histogram(x, t, k, categories) for t in range(k, x.shape[1] + 1)])


def padding_per_pattern(
    n_pad: int, k: int, synth_window: int | None = None, categories: int = 2
) -> int:
    """Records the fixed-window padding contributes to each length-k pattern: ``n_pad · A^(K − k)``
    for a synthesizer window ``K = synth_window`` (default ``k``); needs ``k ≤ K``."""
    n_pad = check_int(n_pad, "n_pad", low=0)
    k = check_int(k, "k", low=1)
    big_k = k if synth_window is None else check_int(synth_window, "synth_window", low=1)
    if k > big_k:
        raise ValueError(
            f"query window k={k} exceeds the synthesizer window synth_window={big_k}: the padding "
            "is not uniform over longer patterns, so such queries cannot be debiased"
        )
    return n_pad * categories ** (big_k - k)


def _denominator(rows: int, n) -> int:
    if n is None:
        return rows
    return check_int(n, "n", low=1)


def pattern_query(
    panel,
    t: int,
    k: int,
    mask,
    *,
    n_pad: int = 0,
    n: int | None = None,
    synth_window: int | None = None,
    categories: int = 2,
) -> tuple[int, float]:
    """``(count, proportion)`` of the query given by a boolean ``mask`` over length-k patterns at step t.

    ``count = Σ_{s∈mask} hist_s − padding_per_pattern · |mask|`` and ``proportion = count / n``
    (``n`` defaults to the panel's rows; pass the real population for synthetic data)."""
    x = _as_panel(panel)
    k = check_int(k, "k", low=1)
    categories = check_int(categories, "categories", low=2)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (categories**k,):
        raise ValueError(
            f"mask must have one entry per pattern ({categories**k}), got shape {mask.shape}"
        )
    hist = window_histogram(x, t, k, categories)
    pad = padding_per_pattern(n_pad, k, synth_window, categories)
    count = int(hist[mask].sum()) - pad * int(mask.sum())
    return count, count / _denominator(x.shape[0], n)


def quarterly_masks(k: int = 3) -> dict[str, np.ndarray]:
    """Masks over binary length-k patterns for :data:`QUARTERLY_QUANTITIES` (k = 3 is a quarter)."""
    k = check_int(k, "k", low=2)
    digits = pattern_digits(k, 2)
    weight = digits.sum(axis=1)
    consecutive = np.any(digits[:, 1:] & digits[:, :-1], axis=1)
    return {
        "at_least_1": weight >= 1,
        "at_least_2": weight >= 2,
        "at_least_2_consecutive": consecutive,
        "all": weight == k,
    }


def quarterly_poverty(
    panel,
    *,
    n_pad: int = 0,
    n: int | None = None,
    k: int = 3,
    synth_window: int | None = None,
) -> dict:
    """The four quarterly poverty quantities for every complete quarter of a binary panel.

    Quarters are the disjoint windows ending at steps ``k, 2k, ...`` (months 1-3, 4-6, ... for
    k = 3). Returns ``{"quarter_end": (Q,) int, "counts": {name: (Q,) int}, "proportions":
    {name: (Q,) float}}``, names as in :data:`QUARTERLY_QUANTITIES`. Raw with the defaults;
    debiased with the synthesizer's ``n_pad`` and the real ``n`` (see the module docstring).
    """
    x = _as_panel(panel)
    masks = quarterly_masks(k)
    ends = np.arange(k, x.shape[1] + 1, k)
    if ends.size == 0:
        raise ValueError(f"the panel's {x.shape[1]} steps hold no complete window of k={k}")
    pad = padding_per_pattern(n_pad, k, synth_window, 2)
    hists = np.stack([window_histogram(x, int(t), k, 2) for t in ends])  # (Q, 2^k)
    denom = _denominator(x.shape[0], n)
    counts = {name: hists[:, m].sum(axis=1) - pad * int(m.sum()) for name, m in masks.items()}
    return {
        "quarter_end": ends,
        "counts": counts,
        "proportions": {name: c / denom for name, c in counts.items()},
    }


def cumulative_counts(panel) -> np.ndarray:
    """``(T, T + 1)`` array ``S[t - 1, b] = #{i : x_i^1 + ... + x_i^t ≥ b}`` of a binary panel
    (so ``S[:, 0] = rows``; ``S_b^t`` of Bun et al. 2024, Algorithm 2)."""
    x = _as_panel(panel)
    if x.size and (x.min() < 0 or x.max() > 1):
        raise ValueError("cumulative queries need a binary panel (values 0/1)")
    rows, horizon = x.shape
    sums = np.cumsum(x, axis=1, dtype=np.int64)  # (rows, T) weight up to each step
    exact = np.stack([np.bincount(sums[:, t], minlength=horizon + 1) for t in range(horizon)])
    # ≥ b is the reversed cumulative sum of the exactly-b counts.
    return np.cumsum(exact[:, ::-1], axis=1)[:, ::-1]


def cumulative_at_least(panel, b: int, *, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, proportions)`` over t = 1..T of "at least b ones up to step t" (b ≥ 0)."""
    x = _as_panel(panel)
    b = check_int(b, "b", low=0)
    if b > x.shape[1]:
        raise ValueError(f"b={b} exceeds the panel's {x.shape[1]} steps")
    counts = cumulative_counts(x)[:, b]
    return counts, counts / _denominator(x.shape[0], n)


def window_max_error(synthetic, truth, k: int, n_pad: int, *, categories: int = 2) -> np.ndarray:
    """Per step t = k..T, ``max_s |p_s^t − n_pad − C_s^t| / n`` (the quantity bounded by
    Theorem 3.2, normalised by the real population ``n = rows of truth``)."""
    synth = _as_panel(synthetic, "synthetic")
    true = _as_panel(truth, "truth")
    if synth.shape[1] != true.shape[1]:
        raise ValueError(f"synthetic has {synth.shape[1]} steps but truth has {true.shape[1]}")
    pad = padding_per_pattern(n_pad, k, None, categories)
    diff = window_histograms(synth, k, categories) - pad - window_histograms(true, k, categories)
    return np.abs(diff).max(axis=1) / true.shape[0]
