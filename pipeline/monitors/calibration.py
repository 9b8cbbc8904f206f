"""Privacy theorems as functions, and calibrations that invert them.

Every ``*_privacy`` function maps internal noise parameters to the (ε, δ) a named theorem gives;
every ``calibrate_*`` function maps a target (ε, δ) (and k / τ / horizon) to internal parameters
and is tested to round-trip: recomputing ε from what it returns gives the target back.

Logs are natural logs throughout (the papers' bounds come from e^{−x} tails). Neighbouring relations
follow docs/privacy.md (:data:`pipeline.privacy.neighbours.NEIGHBOURS`):

* ``add_remove``: one user's whole stream is present or absent;
* ``replace``: one user's whole stream is replaced (Kaplan–Mansour–Stemmer, Notation 4.2 "j-neighbouring").

The derivations (per-user target charging, the evolving-data reductions, group privacy for
ThresholdMonitor under ``replace``) are written out in ``docs/monitors.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

from pipeline.privacy.conversions import zcdp_to_approx_dp
from pipeline.privacy.events import ApproxDP
from pipeline.privacy.neighbours import Neighbours, check_neighbours, sensitivity_factor
from pipeline.privacy.pure_composition import FORMS as COMPOSED_FORMS
from pipeline.privacy.pure_composition import optimal_epsilon, tightest_epsilon

TCT_FORMS = ("basic",) + COMPOSED_FORMS

__all__ = [
    "theorem_3_2_xi",
    "threshold_monitor_noise",
    "threshold_monitor_privacy",
    "calibrate_threshold_monitor",
    "not_prior_q",
    "TargetChargingAccountant",
    "TCTBound",
    "charged_calls_failure",
    "tct_hits_per_user",
    "outside_interval_hits_per_user",
    "individual_charging_privacy",
    "calibrate_individual_charging",
    "svt_restart_privacy",
    "calibrate_svt_restart",
    "naive_privacy",
    "calibrate_naive",
    "outside_interval_privacy",
    "outside_interval_privacy_simplified",
    "calibrate_outside_interval",
    "outside_interval_pure_privacy",
    "calibrate_outside_interval_pure",
]


def _pos(value, name: str, *, high: float = math.inf, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not (v > 0.0) or not math.isfinite(v) or v > high or (high_open and v == high):
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in (0, {high}{bracket}, got {value!r}")
    return v


def _posint(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if int(value) < 1:
        raise ValueError(f"{name} must be at least 1, got {value!r}")
    return int(value)


def _bisect_max(f, lo: float, hi: float, target: float, iters: int = 200) -> float:
    """Largest x in [lo, hi] with f(x) ≤ target for f increasing (to float precision); f(lo) ≤ target."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if f(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------------------------------------
# ThresholdMonitor / ThresholdMonitorEvolving (Kaplan–Mansour–Stemmer, arXiv 2011.07637)
# ------------------------------------------------------------------------------------------------


def theorem_3_2_xi(epsilon: float, delta: float, k: float) -> float:
    """ξ of Kaplan–Mansour–Stemmer Theorem 3.2: ThresholdMonitor run with parameters (ε, δ, k) is (ξ, 3δ)-DP for
    add/remove neighbours S' = S ∪ {x'}, with ξ = 75(k+1)ε/ln(1/δ) + 25ε."""
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    k = _pos(k, "k")
    return 75.0 * (k + 1.0) * epsilon / math.log(1.0 / delta) + 25.0 * epsilon


def threshold_monitor_noise(epsilon: float, delta: float) -> tuple[float, float, float]:
    """Noise of Kaplan–Mansour–Stemmer Algorithm 3 for its parameters (ε, δ): returns (Δ, scale_w, scale_v) with
    Δ = (1/ε)·ln(1/δ)·ln((1/ε)·ln(1/δ)), w ~ Lap(10Δ), v ~ Lap((1/ε)·ln(1/δ)), v̄ = min(v, Δ)."""
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    b = math.log(1.0 / delta) / epsilon
    if b <= math.e:
        # Δ = b·ln b must exceed b for the cap to sit above the scale of v (and be positive at all).
        raise ValueError(
            f"epsilon must satisfy ln(1/delta)/epsilon > e, got epsilon={epsilon!r}, delta={delta!r}"
        )
    big_delta = b * math.log(b)
    return big_delta, 10.0 * big_delta, b


def threshold_monitor_privacy(
    epsilon: float, delta: float, k: float, neighbours: str = "replace"
) -> ApproxDP:
    """(ε, δ) of ThresholdMonitor / ThresholdMonitorEvolving with internal parameters (ε̃, δ̃) = (epsilon, delta).

    * ``add_remove``: Theorem 3.2 directly, (ξ, 3δ̃) (and Theorem 4.4's reduction, which encodes user
      j as the record (j, b) of a fixed database, maps adding/removing user j to adding/removing
      that record).
    * ``replace``: the evolving game's j-neighbours differ in the record (j, 0) vs (j, 1) — a
      replacement, i.e. two add/remove steps; group privacy of (ξ, 3δ̃) over 2 steps gives
      (2ξ, (1 + e^ξ)·3δ̃). (Theorem 4.4's proof cites Theorem 3.8, whose constants are O(·); we use
      Theorem 3.2 instead.)
    """
    check_neighbours(neighbours)
    xi = theorem_3_2_xi(epsilon, delta, k)
    if neighbours == "add_remove":
        return ApproxDP(xi, min(1.0, 3.0 * delta))
    return ApproxDP(2.0 * xi, min(1.0, (1.0 + math.exp(xi)) * 3.0 * delta))


def calibrate_threshold_monitor(
    epsilon: float, delta: float, k: float, neighbours: str = "replace"
) -> tuple[float, float]:
    """Internal (ε̃, δ̃) of ThresholdMonitor(Evolving) so that :func:`threshold_monitor_privacy`
    (Kaplan–Mansour–Stemmer Theorem 3.2, with group privacy for ``replace``) equals the target (ε, δ).

    add_remove: δ̃ = δ/3, ξ = ε. replace: ξ = ε/2, δ̃ = δ/(3(1 + e^{ε/2})). ξ is linear in ε̃ for
    fixed δ̃: ε̃ = ξ / (75(k+1)/ln(1/δ̃) + 25).
    """
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    k = _pos(k, "k")
    check_neighbours(neighbours)
    if neighbours == "add_remove":
        xi, delta_t = epsilon, delta / 3.0
    else:
        if epsilon / 2.0 > 700.0:  # e^{ε/2} overflows a double and δ̃ would underflow to 0
            raise ValueError(
                f"epsilon={epsilon} is too large for the replace calibration: "
                "δ̃ = δ/(3(1 + e^(ε/2))) underflows"
            )
        xi, delta_t = epsilon / 2.0, delta / (3.0 * (1.0 + math.exp(epsilon / 2.0)))
    eps_t = xi / (75.0 * (k + 1.0) / math.log(1.0 / delta_t) + 25.0)
    return eps_t, delta_t


# ------------------------------------------------------------------------------------------------
# Target charging (Cohen–Lyu, NeurIPS 2023, Theorem B.4) and SVT with individual charging (Algorithm 5)
# ------------------------------------------------------------------------------------------------


def not_prior_q(epsilon: float) -> float:
    """q of a NotPrior target of an ε-DP call: 1/(e^ε + 1) (Cohen–Lyu, Lemma C.1; tight)."""
    epsilon = _pos(epsilon, "epsilon")
    return 1.0 / (math.exp(epsilon) + 1.0)


@dataclass(frozen=True)
class TCTBound:
    """One evaluation of Theorem B.4: the (ε, δ) and how it was obtained."""

    epsilon: float
    delta: float
    form: str  # one of TCT_FORMS: the composition theorem that gave ε
    alpha: float
    r: float
    delta_star: float
    delta_composition: float  # the δ given to the composition of the m calls (0 for basic)

    def as_approx_dp(self) -> ApproxDP:
        return ApproxDP(self.epsilon, min(1.0, self.delta))


class TargetChargingAccountant:
    """Theorem B.4 of Cohen–Lyu for calls that are ε-DP with a q-target, halting at τ target hits.

    With r = (1+α)·τ/q, for any α > 0:

    * basic: (r·ε, C_δ + δ*(τ, α));
    * advanced, any δ > 0: (½·r·ε² + ε·√(2·r·ln(1/δ)), δ + C_δ + δ*(τ, α)) — with the 2 under the
      root as in Lemma A.4 (the printed theorem lacks it; notes/tct.md §4).

    The proof composes the (at most r) data-holder calls with Lemma A.4; any valid adaptive
    composition theorem for r ε-DP calls may take its place (docs/monitors.md §2): :meth:`best`
    also tries the zCDP route (CKS conversion) and the optimal homogeneous composition
    (Kairouz–Oh–Viswanath), which is exact for pure calls.

    δ*(τ, α) = P[X > r] with X the number of data-holder calls until τ hits, dominated by the number
    of Bernoulli(q) trials until τ successes, so δ* = P[Y < τ] with Y ~ Binomial(⌊r⌋, q): more than r
    calls means fewer than τ successes in the first ⌊r⌋. (The proof of Theorem B.4 writes
    m = 1 + ⌊r⌋ trials; that is P[X > ⌊r⌋ + 1], one trial too many for the r·ε it is paired with —
    docs/monitors.md §2.) Chernoff: exp(−α²τ/(2(1+α))) still bounds P[Bin(⌊r⌋, q) ≤ τ − 1] (the
    integrality slack of "< τ" covers ⌊r⌋q ≥ (1+α)τ − q). ``exact=True`` uses the Binomial tail,
    ``False`` the Chernoff bound. C_δ = Σ δ_i of the calls (``c_delta``; 0 for pure calls). α appears
    only in the analysis and is optimised after the fact by :meth:`best`, which caps the charged calls
    at a whole m (r = m).
    """

    def __init__(self, epsilon: float, tau: int, q: float | None = None, c_delta: float = 0.0):
        self.epsilon = _pos(epsilon, "epsilon")
        self.tau = _posint(tau, "tau")
        self.q = not_prior_q(self.epsilon) if q is None else _pos(q, "q", high=1.0)
        if not (0.0 <= c_delta < 1.0):
            raise ValueError(f"c_delta must be in [0, 1), got {c_delta!r}")
        self.c_delta = float(c_delta)

    def r(self, alpha: float) -> float:
        alpha = _pos(alpha, "alpha")
        return (1.0 + alpha) * self.tau / self.q

    def delta_star(self, alpha: float, exact: bool = True) -> float:
        alpha = _pos(alpha, "alpha")
        if not exact:
            return math.exp(-(alpha**2) * self.tau / (2.0 * (1.0 + alpha)))
        return charged_calls_failure(math.floor(self.r(alpha)), self.tau, self.q)

    def basic(self, alpha: float, exact: bool = True) -> TCTBound:
        r = self.r(alpha)
        ds = self.delta_star(alpha, exact)
        return TCTBound(
            float(r * self.epsilon), float(self.c_delta + ds), "basic", alpha, r, ds, 0.0
        )

    def advanced(self, alpha: float, delta: float, exact: bool = True) -> TCTBound:
        delta = _pos(delta, "delta", high=1.0, high_open=True)
        r = self.r(alpha)
        ds = self.delta_star(alpha, exact)
        eps = 0.5 * r * self.epsilon**2 + self.epsilon * math.sqrt(2.0 * r * math.log(1.0 / delta))
        return TCTBound(eps, delta + self.c_delta + ds, "advanced", alpha, r, ds, delta)

    def best(
        self, delta: float, exact: bool = True, forms: tuple[str, ...] = TCT_FORMS
    ) -> TCTBound:
        """Smallest ε over whole caps m of data-holder calls (α = mq/τ − 1) and over the
        composition theorems in ``forms`` for the m ε-DP calls, such that the total δ ≤
        ``delta``.

        A cap of m calls fails (is cut off before the τ-th hit) with δ* = P[Bin(m, q) < τ]; the
        rest of the δ budget goes to the composition of the m pure calls: ``basic`` m·ε (δ 0),
        ``advanced`` (Lemma A.4), ``zcdp`` (CKS conversion of m·ε²/2-zCDP) or ``optimal``
        (Kairouz–Oh–Viswanath, exact for pure calls;
        :mod:`pipeline.privacy.pure_composition`).
        Raises ValueError if no cap achieves it."""
        delta = _pos(delta, "delta", high=1.0, high_open=True)
        unknown = [f for f in forms if f not in TCT_FORMS]
        if unknown or not forms:
            raise ValueError(f"forms must be a non-empty subset of {TCT_FORMS}, got {forms!r}")
        budget = delta - self.c_delta
        if budget <= 0:
            raise ValueError(f"delta must exceed c_delta={self.c_delta}, got {delta!r}")
        # Whole caps only: any r in [m, m+1) fails with the probability of m and charges more. The
        # α grid (log-spaced 1e−3…1e4) rounded down to integers, ascending; then every integer
        # between the best cap's grid neighbours.
        grid = np.exp(np.linspace(math.log(1e-3), math.log(1e4), 1400))
        caps = np.unique(np.floor((1.0 + grid) * self.tau / self.q)).astype(np.int64)
        caps = caps[caps > self.tau / self.q]  # α > 0
        best = self._best_over(caps, budget, exact, forms, None)
        if best is None:
            raise ValueError(f"no alpha reaches delta={delta!r} with tau={self.tau}")
        i = int(np.searchsorted(caps, int(best.r)))
        lo, hi = int(caps[max(i - 1, 0)]), int(caps[min(i + 1, caps.size - 1)])
        between = np.arange(lo + 1, hi, dtype=np.int64)
        if between.size > 256:
            between = np.unique(np.linspace(lo + 1, hi - 1, 256).astype(np.int64))
        refined = self._best_over(between, budget, exact, forms, best)
        assert refined is not None  # at least ``best``
        return refined

    def _best_over(
        self,
        caps: np.ndarray,
        budget: float,
        exact: bool,
        forms: tuple[str, ...],
        best: TCTBound | None,
    ) -> TCTBound | None:
        """Scan ascending ``caps``; stop once the optimal composition at the whole ``budget`` (a
        lower bound for every form at every larger cap: it grows with m) reaches the best ε."""
        eps0 = self.epsilon
        composed_forms = tuple(f for f in forms if f != "basic")
        alphas = caps * self.q / self.tau - 1.0
        if exact:
            dstars = stats.binom.cdf(self.tau - 1, caps, self.q)
        else:
            dstars = np.exp(-(alphas**2) * self.tau / (2.0 * (1.0 + alphas)))
        for m, alpha, ds in zip(caps.tolist(), alphas.tolist(), dstars.tolist()):
            if ds >= budget:
                continue
            if best is not None and optimal_epsilon(eps0, m, budget) >= best.epsilon:
                break
            cands: list[TCTBound] = []
            if "basic" in forms:
                cands.append(
                    TCTBound(m * eps0, self.c_delta + ds, "basic", alpha, float(m), ds, 0.0)
                )
            if composed_forms:
                d_comp = budget - ds
                composed = tightest_epsilon(eps0, m, d_comp, composed_forms)
                cands.append(
                    TCTBound(
                        composed.epsilon,
                        self.c_delta + ds + d_comp,
                        composed.form,
                        alpha,
                        float(m),
                        ds,
                        d_comp,
                    )
                )
            for cand in cands:
                if best is None or cand.epsilon < best.epsilon:
                    best = cand
        return best


def charged_calls_failure(calls: int, tau: int, q: float) -> float:
    """P[fewer than τ target hits in ``calls`` calls] when each call hits with probability ≥ q
    independently of the past: P[Bin(calls, q) < τ] — the probability that a target-charging run
    capped at ``calls`` data-holder calls is cut off before its τ-th hit (Theorem B.4's δ*)."""
    if isinstance(calls, bool) or not isinstance(calls, (int, np.integer)) or calls < 0:
        raise ValueError(f"calls must be a non-negative int, got {calls!r}")
    return float(stats.binom.cdf(_posint(tau, "tau") - 1, int(calls), _pos(q, "q", high=1.0)))


def tct_hits_per_user(tau: int, neighbours: str) -> int:
    """Target hits the per-user TCT analysis must allow: τ for add/remove (the user's record is
    removed after τ hits on calls it contributes to); 2τ for replace (the two versions of the
    user's record are charged separately, each removed after τ hits, and every hit on a call in
    which the two worlds can differ charges at least one of them). See docs/monitors.md."""
    check_neighbours(neighbours)
    tau = _posint(tau, "tau")
    return tau if neighbours == "add_remove" else 2 * tau


def individual_charging_privacy(
    epsilon0: float, tau: int, delta: float, neighbours: str = "replace", exact: bool = True
) -> TCTBound:
    """(ε, δ) of SVT with individual charging (Cohen–Lyu Algorithm 5) with noise Lap(1/ε₀) and removal
    after τ hits, at total δ: Theorem B.4 per user with NotPrior q = 1/(e^{ε₀}+1) and
    :func:`tct_hits_per_user` hits, the cap and the composition theorem optimised
    (:meth:`TargetChargingAccountant.best`)."""
    hits = tct_hits_per_user(tau, neighbours)
    return TargetChargingAccountant(epsilon0, hits).best(delta, exact=exact)


def calibrate_individual_charging(
    epsilon: float, delta: float, tau: int, neighbours: str = "replace", exact: bool = True
) -> float:
    """Largest ε₀ such that :func:`individual_charging_privacy` (Cohen–Lyu Theorem B.4) ≤ (ε, δ)."""
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    tau = _posint(tau, "tau")
    check_neighbours(neighbours)
    return _calibrate_individual_charging(epsilon, delta, tau, neighbours, bool(exact))


@lru_cache(maxsize=256)
def _calibrate_individual_charging(
    epsilon: float, delta: float, tau: int, neighbours: str, exact: bool
) -> float:
    def eps_of(e0: float) -> float:
        try:
            return individual_charging_privacy(e0, tau, delta, neighbours, exact).epsilon
        except ValueError:
            return math.inf

    lo = epsilon * 1e-9
    if eps_of(lo) > epsilon:
        raise ValueError(
            f"delta={delta!r} is too small for tau={tau} (no alpha makes delta* small enough)"
        )
    return _bisect_max(eps_of, lo, epsilon, epsilon, iters=80)


# ------------------------------------------------------------------------------------------------
# Restarted AboveThreshold (Kaplan–Mansour–Stemmer Algorithm 2) and the naive per-step histogram
# ------------------------------------------------------------------------------------------------


def svt_restart_privacy(epsilon1: float, max_tops: int, delta: float) -> ApproxDP:
    """AboveThreshold (Kaplan–Mansour–Stemmer Alg. 2, Theorem 2.5) run until ⊤ is ε₁-DP for sensitivity-1 queries
    (a count of users changes by ≤ 1 under both add_remove and replace). Restarting after each ⊤
    and halting after ``max_tops`` ⊤s composes ``max_tops`` ε₁-DP runs. Reported: the smaller of
    basic composition (c·ε₁, 0) and the zCDP route (pure ε₁-DP ⇒ ε₁²/2-zCDP, Bun–Steinke Prop. 1.4;
    c-fold ⇒ c·ε₁²/2-zCDP; converted at ``delta`` with the tight CKS conversion)."""
    epsilon1 = _pos(epsilon1, "epsilon1")
    max_tops = _posint(max_tops, "max_tops")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    basic = max_tops * epsilon1
    via_zcdp = zcdp_to_approx_dp(max_tops * epsilon1**2 / 2.0, delta)
    if via_zcdp < basic:
        return ApproxDP(via_zcdp, delta)
    return ApproxDP(basic, 0.0)


def calibrate_svt_restart(epsilon: float, delta: float, max_tops: int) -> float:
    """Largest ε₁ with :func:`svt_restart_privacy` ≤ ε (composition over ``max_tops`` ⊤s)."""
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    max_tops = _posint(max_tops, "max_tops")
    return _bisect_max(
        lambda e1: svt_restart_privacy(e1, max_tops, delta).epsilon, 0.0, epsilon, epsilon
    )


def naive_privacy(
    sigma2: float, horizon: int, delta: float, neighbours: str = "replace"
) -> ApproxDP:
    """Per-step histogram with discrete Gaussian noise DG(σ²) per bin over ``horizon`` steps.
    Each step is Δ₂²/(2σ²)-zCDP (CKS 2020 Thm 14; Δ₂² = 1 add_remove, 2 replace), composition adds ρ
    (Bun–Steinke Lemma 2.3), and the total is converted with the tight CKS conversion."""
    sigma2 = _pos(sigma2, "sigma2")
    horizon = _posint(horizon, "horizon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    rho = horizon * sensitivity_factor(neighbours) / (2.0 * sigma2)
    return ApproxDP(zcdp_to_approx_dp(rho, delta), delta)


def calibrate_naive(
    epsilon: float, delta: float, horizon: int, neighbours: str = "replace"
) -> float:
    """σ² of the naive per-step histogram so that :func:`naive_privacy` = (ε, δ): the largest total ρ
    with zcdp_to_approx_dp(ρ, δ) ≤ ε, then σ² = horizon·Δ₂²/(2ρ)."""
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    horizon = _posint(horizon, "horizon")
    factor = sensitivity_factor(neighbours)
    hi = 1.0
    while zcdp_to_approx_dp(hi, delta) < epsilon:
        hi *= 2.0
    rho = _bisect_max(lambda r: zcdp_to_approx_dp(r, delta), 0.0, hi, epsilon)
    return horizon * factor / (2.0 * rho)


# ------------------------------------------------------------------------------------------------
# OutsideIntervalMonitor (Ghazi et al., PREM, arXiv 2502.14809)
# ------------------------------------------------------------------------------------------------


def outside_interval_privacy(
    a: float, delta: float, neighbours: str = "replace", exact: bool = True
) -> TCTBound:
    """Approx-DP OutsideIntervalMonitor (Ghazi et al. Alg. 1) with noise Lap(1/a), via target charging
    (the proof of Proposition 2.2 made explicit): each call touching a record is a-DP; the non-Inside
    answers are a NotPrior target with q = 1/(1+e^a); a record's value leaves S_active at the first
    non-Inside answer it contributes to, so one hit per record (two under replace: the old and the
    new value). Theorem B.4 with those hits, α optimised."""
    a = _pos(a, "a")
    return TargetChargingAccountant(a, outside_interval_hits_per_user(neighbours)).best(
        delta, exact=exact
    )


def outside_interval_hits_per_user(neighbours: str) -> int:
    """Target hits one user can cause in an OutsideIntervalMonitor over users (``BandMonitor``):
    its record leaves the active set at the first non-Between answer it contributes to, so 1 under
    add/remove and 2 under replace (the old and the new version of the record, each retired once)."""
    return 1 if check_neighbours(neighbours) is Neighbours.ADD_REMOVE else 2


def outside_interval_privacy_simplified(
    a: float, delta: float, neighbours: str = "replace"
) -> ApproxDP:
    """The notes' explicit constant (Ghazi et al. Theorem C.6 route): τ = ⌈4·ln(1/δ)⌉ hits budget,
    ε = 2τ(1+e^a)·a for add/remove, doubled (and δ doubled) for replace. Looser; for comparison."""
    a = _pos(a, "a")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    tau = math.ceil(4.0 * math.log(1.0 / delta))
    eps = 2.0 * tau * (1.0 + math.exp(a)) * a
    if check_neighbours(neighbours) == "add_remove":
        return ApproxDP(eps, delta)
    return ApproxDP(2.0 * eps, min(1.0, 2.0 * delta))


def calibrate_outside_interval(epsilon: float, delta: float, neighbours: str = "replace") -> float:
    """Largest a ≤ 1 with :func:`outside_interval_privacy` ≤ (ε, δ) (Prop. 2.2 assumes a ≤ 1)."""
    epsilon = _pos(epsilon, "epsilon")
    delta = _pos(delta, "delta", high=1.0, high_open=True)
    check_neighbours(neighbours)

    def eps_of(a: float) -> float:
        try:
            return outside_interval_privacy(a, delta, neighbours).epsilon
        except ValueError:
            return math.inf

    if eps_of(1.0) <= epsilon:
        return 1.0
    return _bisect_max(eps_of, 1e-12, 1.0, epsilon, iters=80)


def outside_interval_pure_privacy(a: float, max_outside: int) -> ApproxDP:
    """Pure-DP OutsideIntervalMonitor (Ghazi et al. Alg. 4, Proposition C.3): ε = a·Γ, δ = 0."""
    return ApproxDP(_pos(a, "a") * _posint(max_outside, "max_outside"), 0.0)


def calibrate_outside_interval_pure(epsilon: float, max_outside: int) -> float:
    """a = ε/Γ (Proposition C.3)."""
    return _pos(epsilon, "epsilon") / _posint(max_outside, "max_outside")
