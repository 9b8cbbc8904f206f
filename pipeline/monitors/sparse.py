"""The per-step active histogram and the sparse "query every element of the domain" step of the
heavy-hitter engines: the elements nobody holds are never touched one by one."""

from __future__ import annotations

import numpy as np

from pipeline.privacy.exact import ProbabilityFn
from pipeline.privacy.laws import binomial_draw, choose_absent_ids
from pipeline.privacy.rng import RandomSource

__all__ = ["active_histogram", "sparse_flags"]


def active_histogram(vals: np.ndarray, domain_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(support, counts): the sorted distinct elements among ``vals`` and their counts.
    One bincount when the domain is small relative to the input, else one np.unique (O(n log n))."""
    if vals.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if domain_size <= 4 * vals.size + (1 << 16):
        counts = np.bincount(vals, minlength=domain_size)
        support = np.flatnonzero(counts)
        return support.astype(np.int64), counts[support].astype(np.int64)
    support, counts = np.unique(vals, return_counts=True)
    return support.astype(np.int64), counts.astype(np.int64)


def sparse_flags(
    source: RandomSource,
    domain_size: int,
    support: np.ndarray,
    support_flagged: np.ndarray,
    p_zero: ProbabilityFn,
) -> tuple[np.ndarray, np.ndarray]:
    """Add the zero-count elements to a step's flags without touching them one by one.

    Every element x outside ``support`` has count 0 and is flagged iff its own fresh noise N_x
    reaches the threshold, independently across x with the same probability p (``p_zero``: the
    noise law's tail as rigorous intervals, ``lambda d: law.sf_interval(t, d)``). The flagged subset
    F of the Z = domain_size − |support| zero-count ids is then a set of independent Bernoulli(p)
    indicators, whose law is: |F| ~ Binomial(Z, p) and, given |F| = K, F is uniform among the
    K-subsets (the indicators are exchangeable). K is drawn from Binomial(Z, p) exactly (inversion
    with exact comparisons, :mod:`pipeline.privacy.exact`) and the K ids uniformly with exact
    integer draws, so the output has exactly the law of querying every element.
    Returns (flagged ids sorted, the zero-count ids among them).
    """
    z = domain_size - support.size
    k = binomial_draw(source, z, p_zero) if z > 0 else 0
    zeros = choose_absent_ids(source, domain_size, support, k)
    flagged = support[support_flagged]
    if zeros.size:
        flagged = np.union1d(flagged, zeros)
    return flagged.astype(np.int64), zeros
