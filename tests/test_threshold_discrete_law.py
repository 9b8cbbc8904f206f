"""ThresholdMonitor's proof (Kaplan–Mansour–Stemmer, Lemma 3.7 and Appendix A) with the discrete
Laplace the monitor draws instead of the continuous one: every distributional fact the proof uses,
evaluated in closed form for the scales the built monitor uses (docs/monitors.md §1).

For an integer-valued X with pmf ∝ ρ^|x| (ρ = e^{−1/s}): P(X ≥ c) = ρ^c/(1+ρ) for integers
c ≥ 1, and P(X ≤ −c) the same by symmetry."""

import math

import pytest

from pipeline.monitors import ThresholdMonitor
from pipeline.monitors import calibration as cal


def upper_tail(scale: float, c: int) -> float:
    """P(X ≥ c), c ≥ 1 an integer."""
    rho = math.exp(-1.0 / scale)
    return rho**c / (1.0 + rho)


def at_least(x: float) -> int:
    """The smallest integer ≥ x (lattice points of X ≥ x)."""
    return math.ceil(x)


TARGETS = [(eps, delta, k) for eps in (0.1, 0.5, 1.0, 2.0, 5.0) for delta in (1e-9, 1e-6, 1e-3)
           for k in (1, 3, 20)]


@pytest.mark.parametrize("granularity", [1, 4])
def test_lemma_3_7_and_appendix_a_hold_for_the_discrete_law(granularity):
    worst_printed = 0.0
    for eps, delta, k in TARGETS:
        eps_t, delta_t = cal.calibrate_threshold_monitor(eps, delta, k)
        mon = ThresholdMonitor(10, eps_t, delta_t, threshold=5, k=k, granularity=granularity)
        g, s_v, s_w, cap = granularity, mon._scale_v, mon._scale_w, mon._cap_units
        gamma = eps_t / math.log(1.0 / delta_t)  # the lemma's e^{ε/log(1/δ)} per unit of f(x')
        # the shift ratios: a shift by f(x')·g lattice units changes v's pmf by ≤ e^{f·g/s_v}
        assert g / s_v <= gamma * (1 + 1e-12)
        p_cap = upper_tail(s_v, at_least(cap))  # P(v ≥ Δ): v̄ = v below the cap
        # printed intermediate step (special-almost): 1 − γ/2 ≤ P(v < Δ); it may fail, by a little
        worst_printed = max(worst_printed, p_cap / (gamma / 2.0) - 1.0)
        # the inequality the lemma needs: 1 ≤ e^γ · P(v < Δ)
        assert math.exp(gamma) * (1.0 - p_cap) >= 1.0
        # Appendix A (Claim A.3): P(v < −Δ) ≤ 1/4 and P(v ≥ −Δ) ≥ 1/2
        p_below = upper_tail(s_v, math.floor(cap) + 1)  # v < −Δ ⟺ v ≤ −(⌊Δ⌋ + 1)
        assert p_below <= 0.25 and 1.0 - p_below >= 0.5
        # w ~ DL(10Δ): any half-open interval of length 3Δ holds ≤ 1/4 of it (the centred one
        # is the largest)
        half = math.ceil(1.5 * cap)
        assert 1.0 - 2.0 * upper_tail(s_w, half) <= 0.25
        # P(w ≥ c + 3Δ | w ≥ c) ≥ 1/2 for every c: smallest for c ≥ 1, where it is ρ^{⌈3Δ⌉}
        assert math.exp(-math.ceil(3.0 * cap) / s_w) >= 0.5
        # Claim A.4: given an almost-top, w lies in [t − f(S) − 2Δ, t − f(S) − v̄), ≥ Δ long
        # (v̄ ≤ Δ):
        # ≥ ⌊Δg⌋ lattice points whose pmf varies by ≤ e^{Δg/s_w} across it, so an interval of length
        # f(x') (≤ f·g points) has conditional probability ≤ f·g·e^{Δg/s_w}/⌊Δg⌋ ≤ f
        assert g * math.exp(cap / s_w) / math.floor(cap) <= 1.0
    # the printed step fails for the discrete law, by ≤ 0.5% (relative excess of P(v ≥ Δ) over γ/2)
    assert 0.0 < worst_printed <= 0.005
