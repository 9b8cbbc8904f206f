"""zCDP -> (ε, δ): the tight conversion, its inverse and the classic bound for comparison."""

from __future__ import annotations

import math

from pipeline.privacy.checks import check_real
from pipeline.privacy.roots import increasing_root

__all__ = ["zcdp_to_approx_dp", "approx_dp_delta", "classic_zcdp_to_approx_dp"]

# Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy", Proposition 12
# / Corollary 13: a ρ-zCDP mechanism is (ε, δ)-DP for every α > 1 with
#
#     δ(α, ε) = exp((α−1)(αρ − ε)) / (α−1) · (1 − 1/α)^α ,
#     ln δ(α, ε) = A(α) − (α−1)ε,   A(α) = (α−1)αρ + α ln(1 − 1/α) − ln(α−1).
#
# δ for a given ε: d/dα ln δ = (2α−1)ρ − ε + ln(1 − 1/α) is increasing in α (ln δ is convex), so
# the optimal α is the unique root of (2α−1)ρ + ln(1 − 1/α) = ε.
#
# ε for a given δ: ε(α) = (A(α) − ln δ)/(α−1). Its derivative has the sign of
# g(α) = (α−1)A'(α) − A(α) + ln δ = (α−1)²ρ + ln α − ln(1/δ), and g' = (α−1)A''(α) > 0, so the
# optimal α is the unique root of (α−1)²ρ + ln α = ln(1/δ), where ε(α) = A'(α) = (2α−1)ρ + ln(1−1/α).
#
# Both roots are found in u = ln(α−1) (α = 1 + e^u), which keeps α → 1 (large ρ) and α ≫ 1
# (tiny ρ) equally well conditioned. Any α gives a valid bound, so root-finding error only makes
# the answer (very slightly) less tight, never invalid; float rounding is not made conservative.
#
# Second valid bound, used when better (as dp_accounting does): ρ-zCDP gives KL ≤ ρ (D_α ≤ αρ for
# α → 1), the Bretagnolle–Huber inequality gives TV ≤ sqrt(1 − e^{−KL}), and TV ≤ δ is exactly
# (0, δ)-DP. So δ ≥ sqrt(1 − e^{−ρ}) ⇒ ε = 0.


_RTOL = 4.0 * 2.0**-52  # the root to 4 ulps (scipy.optimize.brentq's smallest allowed rtol)


def _log1pexp(u: float) -> float:
    """ln(1 + e^u) without overflow (= ln α for α = 1 + e^u)."""
    return u + math.log1p(math.exp(-u)) if u > 0 else math.log1p(math.exp(u))


def _kl_delta(rho: float) -> float:
    return math.sqrt(-math.expm1(-rho))


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """Smallest ε such that every ρ-zCDP mechanism is (ε, δ)-DP by CKS 2020 Prop. 12 / Cor. 13.

    ε = min_{α>1} [αρ + ln(1 − 1/α) − (ln δ + ln α)/(α − 1)], attained at the root α* of
    (α−1)²ρ + ln α = ln(1/δ), where ε = (2α*−1)ρ + ln(1 − 1/α*) (derivation in the comment above).
    Also ε = 0 when δ ≥ sqrt(1 − e^{−ρ}) (KL ≤ ρ and Bretagnolle–Huber). Never larger than the
    classic ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Proposition 1.3).

    ``rho`` ≥ 0 (finite), ``delta`` in [0, 1]. ρ = 0 → 0; δ = 0 with ρ > 0 → inf; δ = 1 → 0.
    """
    rho = check_real(rho, "rho")
    delta = check_real(delta, "delta", high=1.0)
    if rho == 0.0 or delta == 1.0:
        return 0.0
    if delta == 0.0:
        return math.inf
    if delta >= _kl_delta(rho):
        return 0.0
    log_inv_delta = -math.log(delta)

    def g(u: float) -> float:  # (α−1)²ρ + ln α − ln(1/δ), increasing in u
        return math.exp(2.0 * u) * rho + _log1pexp(u) - log_inv_delta

    # Bracket: ln α ≤ α − 1 = e^u, so g < 0 once e^{2u}ρ and e^u are both ≤ ln(1/δ)/2;
    # g > 0 once e^{2u}ρ > ln(1/δ).
    u_lo = min(0.5 * math.log(log_inv_delta / (2.0 * rho)), math.log(log_inv_delta / 2.0)) - 1.0
    u_hi = 0.5 * math.log(log_inv_delta / rho) + 1.0
    u = increasing_root(g, u_lo, u_hi, xtol=1e-15, rtol=_RTOL)
    # ε(α) is flat at α*, so evaluating the defining formula at α* is the accurate way to read it.
    alpha_m1 = math.exp(u)
    log_alpha = _log1pexp(u)
    eps = (1.0 + alpha_m1) * rho + (u - log_alpha) - (-log_inv_delta + log_alpha) / alpha_m1
    return max(0.0, eps)


def approx_dp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ such that every ρ-zCDP mechanism is (ε, δ)-DP (inverse of :func:`zcdp_to_approx_dp`).

    δ = min(1, sqrt(1 − e^{−ρ}), min_{α>1} exp((α−1)(αρ − ε)) / (α−1) · (1 − 1/α)^α), the inner
    minimum at the root of (2α−1)ρ + ln(1 − 1/α) = ε (CKS 2020 Prop. 12 / Cor. 13).
    ``rho`` ≥ 0 (finite), ``epsilon`` ≥ 0 (inf allowed → 0).
    """
    rho = check_real(rho, "rho")
    epsilon = check_real(epsilon, "epsilon", allow_inf=True)
    if rho == 0.0 or math.isinf(epsilon):
        return 0.0

    def h(u: float) -> float:  # (2α−1)ρ + ln(1 − 1/α) − ε, increasing in u
        return (1.0 + 2.0 * math.exp(u)) * rho + (u - _log1pexp(u)) - epsilon

    # Bracket: for u ≤ 0, h ≤ 3ρ + u − ε; for u ≥ 0, ln(1 − 1/α) ≥ −ln 2.
    u_lo = min(0.0, epsilon - 3.0 * rho) - 1.0
    u_hi = max(0.0, math.log((epsilon + 1.0) / (2.0 * rho))) + 1.0
    u = increasing_root(h, u_lo, u_hi, xtol=1e-15, rtol=_RTOL)
    alpha_m1 = math.exp(u)
    log_1m_inv_alpha = u - _log1pexp(u)
    log_delta = (
        alpha_m1 * ((1.0 + alpha_m1) * rho - epsilon) + (1.0 + alpha_m1) * log_1m_inv_alpha - u
    )
    return min(1.0, math.exp(log_delta), _kl_delta(rho))


def classic_zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Proposition 1.3): valid but looser; for comparison."""
    rho = check_real(rho, "rho")
    delta = check_real(delta, "delta", low=0.0, low_open=True, high=1.0)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
