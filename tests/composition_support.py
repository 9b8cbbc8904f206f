"""Independent recomputations of the composition of m ε₀-DP calls for the tests: a direct
hockey-stick sum of m-fold randomized response (scipy's Binomial pmf, linear space) and Google's
dp_accounting privacy-loss-distribution accountant (an upper bound)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
from scipy import stats

PLD_GRID = 1e-5  # value discretisation of the PLD: its pessimistic ε exceeds the exact by ≤ m·grid


def direct_delta(eps0: float, m: int, epsilon: float) -> float:
    """δ(ε) of m-fold randomized response with parameter ε₀, summed directly."""
    ls = np.arange(m + 1)
    p = stats.binom.pmf(ls, m, 1.0 / (1.0 + math.exp(eps0)))  # l responses disagree
    loss = (m - 2 * ls) * eps0
    gap = np.minimum(epsilon - loss, 0.0)
    return float(np.sum(np.where(loss > epsilon, p * (1.0 - np.exp(gap)), 0.0)))


def direct_epsilon(eps0: float, m: int, delta: float) -> float:
    """Smallest ε with direct_delta ≤ δ, by bisection (returns the upper end: valid)."""
    if direct_delta(eps0, m, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, m * eps0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if direct_delta(eps0, m, mid) <= delta else (mid, hi)
    return hi


def pld_epsilon(eps0: float, m: int, delta: float) -> float:
    """ε at δ of m self-composed worst-case ε₀-DP pairs by dp_accounting (pessimistic PLD)."""
    params = dp_accounting.pld.common.DifferentialPrivacyParameters(eps0, 0.0)
    pld = dp_accounting.pld.privacy_loss_distribution.from_privacy_parameters(
        params, value_discretization_interval=PLD_GRID)
    return float(pld.self_compose(m).get_epsilon_for_delta(delta))
