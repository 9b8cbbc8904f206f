"""ε of the adaptive composition of m ε₀-DP mechanisms at a given δ: three valid bounds and the
tightest of them.

* ``advanced``: ½mε₀² + ε₀·√(2m·ln(1/δ)) (Cohen–Lyu Lemma A.4; it is also pure ε₀-DP ⇒ ε₀²/2-zCDP,
  Bun–Steinke 2016 Prop. 1.4, composed, Lemma 2.3, then their classic conversion, Prop. 1.3).
* ``zcdp``: the same m·ε₀²/2-zCDP converted with the tight Canonne–Kamath–Steinke conversion
  (:func:`pipeline.privacy.conversions.zcdp_to_approx_dp`), never larger than ``advanced``.
* ``optimal``: Kairouz, Oh, Viswanath, "The Composition Theorem for Differential Privacy"
  (ICML 2015; IEEE Trans. Inf. Theory 63(6), 2017), Theorem 3.3: the m-fold adaptive
  composition of ε₀-DP mechanisms has exactly the privacy region of m independent binary
  randomized responses with parameter ε₀. Its δ at any ε is therefore the hockey-stick
  divergence of that pair,

      δ(ε) = Σ_{l=0}^{m} C(m, l) e^{(m−l)ε₀} / (1 + e^{ε₀})^m · [1 − e^{ε − (m−2l)ε₀}]₊ ,

  (l = responses that disagree with the input; (m−2l)ε₀ is the privacy loss), a finite sum. It is
  exact, so it is never larger than the other two; they are kept as checks and for the docs.

The sum is evaluated in log space (log-binomials by ``gammaln``, ``logaddexp`` prefix sums), so no
term over- or underflows in a way that matters; the ε returned is solved for δ·(1 − 10⁻⁹), which
absorbs the float error of an (m+1)-term sum (relative ≲ m·10⁻¹⁶) so the answer stays valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from pipeline.privacy.conversions import zcdp_to_approx_dp

__all__ = [
    "ComposedBound",
    "FORMS",
    "advanced_epsilon",
    "zcdp_epsilon",
    "optimal_delta",
    "optimal_epsilon",
    "tightest_epsilon",
]

FORMS = ("advanced", "zcdp", "optimal")
_SAFETY = 1.0 - 1e-9  # solve for a δ this much below the target (float error of the sum)


@dataclass(frozen=True)
class ComposedBound:
    """ε of m ε₀-DP calls at ``delta`` and which composition theorem gave it."""

    epsilon: float
    delta: float
    form: str


def _check(eps0: float, m: int) -> tuple[float, int]:
    if not (eps0 > 0.0) or not math.isfinite(eps0):
        raise ValueError(f"eps0 must be positive and finite, got {eps0!r}")
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"m must be a positive int, got {m!r}")
    return float(eps0), int(m)


def advanced_epsilon(eps0: float, m: int, delta: float) -> float:
    """½mε₀² + ε₀√(2m ln(1/δ)) (Cohen–Lyu Lemma A.4, with the 2 under the root)."""
    eps0, m = _check(eps0, m)
    return 0.5 * m * eps0**2 + eps0 * math.sqrt(2.0 * m * math.log(1.0 / delta))


def zcdp_epsilon(eps0: float, m: int, delta: float) -> float:
    """m·ε₀²/2-zCDP (Bun–Steinke Prop. 1.4 and Lemma 2.3) at δ by the CKS conversion."""
    eps0, m = _check(eps0, m)
    return zcdp_to_approx_dp(m * eps0**2 / 2.0, delta)


def _randomized_response_terms(eps0: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """log P_l (l = 0..m disagreements, P = the composed response on one input) and the loss
    (m − 2l)·ε₀ of each, largest loss first."""
    ls = np.arange(m + 1, dtype=np.float64)
    log_binom = gammaln(m + 1.0) - gammaln(ls + 1.0) - gammaln(m - ls + 1.0)
    log_p = log_binom + (m - ls) * eps0 - m * np.logaddexp(0.0, eps0)
    return log_p, (m - 2.0 * ls) * eps0


def optimal_delta(eps0: float, m: int, epsilon: float) -> float:
    """δ(ε) of the optimal homogeneous composition (Kairouz–Oh–Viswanath Theorem 3.3): the
    hockey-stick divergence of m-fold randomized response at e^ε."""
    eps0, m = _check(eps0, m)
    log_p, loss = _randomized_response_terms(eps0, m)
    active = loss > epsilon
    if not active.any():
        return 0.0
    gap = epsilon - loss[active]  # < 0
    return float(np.exp(np.logaddexp.reduce(log_p[active] + np.log(-np.expm1(gap)))))


def optimal_epsilon(eps0: float, m: int, delta: float) -> float:
    """Smallest ε ≥ 0 with :func:`optimal_delta` (ε₀, m, ε) ≤ δ (solved at δ·(1 − 10⁻⁹)).

    δ(ε) is continuous and decreasing; on [loss_j, loss_{j−1}] only l < j are active, so
    δ(ε) = A_j − e^ε·B_j with A_j = Σ_{l<j} P_l, B_j = Σ_{l<j} P_l e^{−loss_l}: the crossing
    interval is found from δ at the loss values (prefix sums) and ε = ln(A_j − δ) − ln B_j
    inside it."""
    eps0, m = _check(eps0, m)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    target = delta * _SAFETY
    if optimal_delta(eps0, m, 0.0) <= target:
        return 0.0
    log_p, loss = _randomized_response_terms(eps0, m)
    log_a = np.logaddexp.accumulate(log_p)  # log_a[i] = ln Σ_{l≤i} P_l
    log_b = np.logaddexp.accumulate(log_p - loss)  # log_b[i] = ln Σ_{l≤i} P_l e^{−loss_l}
    # δ at ε = loss_j for j = 1..m: A − e^{loss_j}·B over l ≤ j − 1
    # (each term P_l·(1 − e^{loss_j − loss_l}) > 0, so no cancellation)
    with np.errstate(divide="ignore"):
        log_delta_at = log_a[:-1] + np.log(-np.expm1(loss[1:] + log_b[:-1] - log_a[:-1]))
    # δ(0) > target and δ grows as ε falls, so some loss_j ≤ 0 has δ > target: the first such j
    # brackets the crossing in [loss_j, loss_{j−1}], where l ≤ j − 1 are the active terms.
    j = int(np.argmax(log_delta_at > math.log(target))) + 1
    log_rest = log_a[j - 1] + math.log(-math.expm1(math.log(target) - log_a[j - 1]))
    return max(0.0, float(log_rest - log_b[j - 1]))


def tightest_epsilon(
    eps0: float, m: int, delta: float, forms: tuple[str, ...] = FORMS
) -> ComposedBound:
    """The smallest ε of the named composition theorems for m ε₀-DP calls at ``delta``."""
    funcs = {"advanced": advanced_epsilon, "zcdp": zcdp_epsilon, "optimal": optimal_epsilon}
    unknown = [f for f in forms if f not in funcs]
    if unknown or not forms:
        raise ValueError(f"forms must be a non-empty subset of {FORMS}, got {forms!r}")
    best = min((funcs[f](eps0, m, delta), f) for f in forms)
    return ComposedBound(float(best[0]), float(delta), best[1])
