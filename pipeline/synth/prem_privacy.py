"""Privacy plans of PREM (Ghazi, Guzmán, Kamath, Knop, Kumar, Manurangsi, Sachdeva, "PREM: Privately
Answering Statistical Queries with Relative Error", arXiv 2502.14809): noise parameters, margins and
the additive term α for a target (ε, δ), and the inverse map (noise parameters → (ε, δ)) used by the
round-trip tests. Derivations: docs/prem.md.

Two accountings, both under replace-one neighbours (the paper's setting; n = ||h||₁ is public):

* ``"paper"`` (Algorithm 3, Theorem 3.1 for δ > 0): the noisy masses ñ_i take (ε/2, δ/2) by advanced
  composition over I draws; the I·T worst-case FindMarginExample calls take (ε/2, δ/2) by advanced
  composition, each call δ' = δ/(4IT); each call's interval monitor is calibrated with target
  charging (:func:`pipeline.monitors.calibration.outside_interval_privacy`). With the pure monitor
  (Algorithm 4, Theorem 3.5): basic composition, ñ part ε/2 over I draws, each call ε/(2IT).
* ``"charged"``: one target-charging run over *all* monitor queries of all calls (Cohen & Lyu,
  "The Target-Charging Technique for Privacy Analysis across Interactive Computations",
  Theorem B.4, per record): a record is charged at most once per call, so ≤ K = ``max_calls`` times
  in the whole run; the zCDP part (a noisy starting histogram and the ñ_i, discrete Gaussian) is
  converted at δ/2; the two parts compose concurrently (Vadhan & Zhang, "Concurrent Composition
  Theorems for Differential Privacy", STOC 2023).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipeline.monitors import calibration as cal
from pipeline.monitors.interval import (
    OutsideIntervalMonitor,
    OutsideIntervalMonitorPure,
    _two_sided_margin,
)
from pipeline.privacy.conversions import zcdp_to_approx_dp
from pipeline.privacy.events import ApproxDP
from pipeline.privacy.laws import DiscreteGaussianLaw, DiscreteLaplaceLaw, upper_quantile
from pipeline.privacy.neighbours import sensitivity_factor
from pipeline.privacy.noise import used_scale
from pipeline.validation import check_int, check_real

__all__ = [
    "PremPlan",
    "advanced_composition",
    "calibrate_advanced_composition",
    "paper_plan",
    "charged_plan",
    "plan_privacy",
    "max_rho",
    "ACCOUNTINGS",
    "MONITORS",
]

ACCOUNTINGS = ("paper", "charged")
MONITORS = ("approx", "pure")
NEIGHBOURS = "replace"


def advanced_composition(eps0: float, k: int, delta_slack: float) -> float:
    """ε of the k-fold adaptive composition of (ε₀, δ₀)-DP mechanisms at slack δ̃ (total δ = kδ₀ + δ̃):
    √(2k·ln(1/δ̃))·ε₀ + k·ε₀(e^{ε₀} − 1) (Dwork, Rothblum & Vadhan, "Boosting and Differential
    Privacy", FOCS 2010, Theorem III.3; Dwork & Roth 2014, Theorem 3.20)."""
    eps0 = check_real(eps0, "eps0", low=0.0)
    k = check_int(k, "k", low=1)
    delta_slack = check_real(
        delta_slack, "delta_slack", low=0.0, high=1.0, low_open=True, high_open=True
    )
    return math.sqrt(2.0 * k * math.log(1.0 / delta_slack)) * eps0 + k * eps0 * math.expm1(eps0)


def calibrate_advanced_composition(epsilon: float, k: int, delta_slack: float) -> float:
    """Largest ε₀ with :func:`advanced_composition` (ε₀, k, δ̃) ≤ ε (bisection; increasing in ε₀)."""
    epsilon = check_real(epsilon, "epsilon", low=0.0, low_open=True)
    return cal._bisect_max(lambda e: advanced_composition(e, k, delta_slack), 0.0, epsilon, epsilon)


def _dg_margin(sigma2: float, per_draw: float) -> int:
    """Smallest c ≥ 0 with P(|N| > c) ≤ per_draw for N ~ DG(σ²): 2·P(N ≥ c+1) ≤ per_draw."""
    return max(
        0, upper_quantile(DiscreteGaussianLaw(sigma2), math.log(per_draw / 2.0), start=1) - 1
    )


def _monitor_margin(
    monitor: str, a: float, gamma: int, rounds: int, beta: float, runs: int = 1
) -> tuple[int, int]:
    """Proposition 2.2 / C.3 margin C of the interval monitor (exact discrete tails), reusing the
    monitors' own margins (a throw-away instance: only ``a`` matters), and the part of it that bounds
    the pure monitor's threshold noise η (0 for approx). ``runs``: monitors (calls) the R = ``rounds``
    queries are spread over, each with its own η (pure)."""
    dummy = np.zeros(1, dtype=np.int64)
    if monitor == "approx":
        return OutsideIntervalMonitor(dummy, a, seed=0).utility_margin(rounds, beta), 0
    c_eta, c_nu = OutsideIntervalMonitorPure(dummy, a, gamma, seed=0).utility_margins(
        rounds, beta, runs
    )
    return c_eta + c_nu, c_eta


@dataclass(frozen=True)
class PremPlan:
    """Everything PREM draws and decides with, derived from (|X|, |F|, ζ, ε, δ, β) (and n for I)."""

    accounting: str
    monitor: str
    epsilon: float
    delta: float
    beta: float
    zeta: float
    n_queries: int  # m = |F| + 1 (the all-ones query is always added, paper footnote 2)
    rounds: int  # I (paper) or the cap on certified rounds (charged)
    steps: int  # T: MWU steps per round (paper); 0 when capped by max_calls instead
    max_calls: int  # I·T (paper) or K (charged): FindMarginExample calls allowed
    max_passes: int  # passes per call (paper: m + 1, never binding; ≤ m² queries per call)
    eta: float  # MWU step
    a: float  # monitor noise parameter (DLap(a): pmf ∝ e^{−a|x|})
    gamma: int  # pure monitor: max Above/Below answers per call (= m)
    mass_noise: str  # "laplace" (scale 1/a_n) or "gaussian" (σ²)
    mass_param: float  # a_n or σ_n²
    init_sigma2: float  # σ² of the noisy starting histogram (charged); 0 = uniform start
    margin: int  # C: every monitor answer is within C w.p. ≥ 1 − β_monitor
    mass_margin: int  # B: every |ñ_i − n_i| ≤ B w.p. ≥ 1 − β_mass
    alpha0: float  # per-certified-round additive term 2(1+ζ)C (Lemma 3.2)
    stop: float  # stop when ñ_i ≤ stop
    alpha: float  # additive term of the (ζ, α) guarantee
    printed_alpha: float = math.nan  # paper variant: (200I/ε')·ln(4|F|/β') as printed
    extra: dict = field(default_factory=dict)


def _check_common(domain_size, n_queries, zeta, epsilon, delta, beta):
    domain_size = check_int(domain_size, "domain_size", low=2)
    n_queries = check_int(n_queries, "n_queries", low=1)
    zeta = check_real(zeta, "zeta", low=0.0, high=0.5, low_open=True, high_open=True)
    epsilon = check_real(epsilon, "epsilon", low=0.0, high=1.0, low_open=True)
    delta = check_real(delta, "delta", low=0.0, high=1.0, high_open=True)
    beta = check_real(beta, "beta", low=0.0, high=1.0, low_open=True, high_open=True)
    return domain_size, n_queries, zeta, epsilon, delta, beta


def paper_plan(
    n: int,
    domain_size: int,
    n_queries: int,
    zeta: float,
    epsilon: float,
    delta: float,
    beta: float,
    monitor: str = "approx",
) -> PremPlan:
    """Algorithm 3's constants: I = ⌈ln n/ln(6/5)⌉, T = ⌈128·ln|X|/ζ²⌉, η = ζ/4, β' = β/(2IT).

    approx monitor (δ > 0): ñ_i ~ n_i + DLap(a_n) with a_n calibrated so that I-fold advanced
    composition at slack δ/2 gives ε/2 (the printed a_n = ε/(4√(2I·ln(I/δ))) gives less); each of the
    I·T calls is (ε', δ') with δ' = δ/(4IT) and ε' from I·T-fold advanced composition at slack δ/4
    = ε/2; the monitor's a is the largest with target-charging privacy (ε', δ').
    pure monitor: a_n = ε/(2I), each call ε' = ε/(2IT), a = ε'/Γ (Proposition C.3), Γ = m.

    α: the proof of Theorem 3.1 needs I·α₀ ≤ 2α/3 and α/4 ≥ 64·B/ζ (Claim 3.3), B the ñ margin
    at β'; we take α = max(that, the printed α) so both the proof and the printed stop rule hold.
    """
    domain_size, n_queries, zeta, epsilon, delta, beta = _check_common(
        domain_size, n_queries, zeta, epsilon, delta, beta
    )
    n = check_int(n, "n", low=2)
    if monitor not in MONITORS:
        raise ValueError(f"monitor must be one of {MONITORS}, got {monitor!r}")
    if monitor == "approx" and delta == 0.0:
        raise ValueError(
            "delta must be > 0 with monitor='approx' (use monitor='pure' for delta = 0)"
        )
    m = n_queries + 1
    rounds = math.ceil(math.log(n) / math.log(6.0 / 5.0))
    steps = math.ceil(128.0 * math.log(domain_size) / zeta**2)
    calls = rounds * steps
    beta_p = beta / (2.0 * calls)
    if monitor == "approx":
        a_n = min(1.0, calibrate_advanced_composition(epsilon / 2.0, rounds, delta / 2.0))
        eps_call = calibrate_advanced_composition(epsilon / 2.0, calls, delta / 4.0)
        delta_call = delta / (4.0 * calls)
        a = cal.calibrate_outside_interval(eps_call, delta_call, NEIGHBOURS)
    else:
        a_n = epsilon / (2.0 * rounds)
        eps_call, delta_call = epsilon / (2.0 * calls), 0.0
        a = eps_call / m
    margin, eta_margin = _monitor_margin(
        monitor, a, m, m * m, beta_p
    )  # per call, union over calls via β'
    mass_margin = _two_sided_margin(DiscreteLaplaceLaw(used_scale(1.0 / a_n)), beta_p)
    alpha0 = 2.0 * (1.0 + zeta) * margin
    printed = 200.0 * rounds / eps_call * math.log(4.0 * n_queries / beta_p)
    alpha = max(1.5 * rounds * alpha0, 256.0 * mass_margin / zeta, printed)
    # passes: each inaccurate pass drops a query, so at most m + 1 (the last one accurate) — no cap
    return PremPlan(
        "paper",
        monitor,
        epsilon,
        delta,
        beta,
        zeta,
        m,
        rounds,
        steps,
        calls,
        m + 1,
        zeta / 4.0,
        a,
        m,
        "laplace",
        a_n,
        0.0,
        margin,
        mass_margin,
        alpha0,
        alpha / 4.0,
        alpha,
        printed,
        {
            "eps_call": eps_call,
            "delta_call": delta_call,
            "beta_call": beta_p,
            "eta_margin": eta_margin,
            "paper_a_n": epsilon / (4.0 * math.sqrt(2.0 * rounds * math.log(rounds / delta)))
            if delta > 0
            else epsilon / rounds,
        },
    )


def charged_plan(
    domain_size: int,
    n_queries: int,
    zeta: float,
    epsilon: float,
    delta: float,
    beta: float,
    monitor: str = "approx",
    max_rounds: int = 3,
    max_calls: int = 20,
    max_passes: int = 4,
    eta: float | None = None,
    zcdp_share: float = 0.3,
    init_share: float = 0.8,
    certify_share: float = 0.9,
) -> PremPlan:
    """The charged accounting (docs/prem.md §3). Budget: ε·zcdp_share (at δ/2) for the zCDP part —
    a fraction ``init_share`` of its ρ for the noisy starting histogram (DG(σ²) per element,
    replace Δ₂² = 2), the rest for the ``max_rounds`` + 1 masses ñ (DG(σ_n²), sensitivity 1);
    the remaining ε (at δ/2) for the monitor queries of at most K = ``max_calls`` calls, as one
    target-charging run with ≤ K hits per record (2K under replace).

    Margins, at β/2 each: C over all K·m·P monitor queries (P = ``max_passes``), B over the ñ draws.
    α₀ = 2(1+ζ)C; stop when ñ ≤ α₀; α = max_rounds·α₀ + α₀ + B (certified rounds + the remainder).
    With the pure monitor the calls are (a·Γ)-DP, composed in zCDP with the rest ((aΓ)²/2 each).
    """
    domain_size, n_queries, zeta, epsilon, delta, beta = _check_common(
        domain_size, n_queries, zeta, epsilon, delta, beta
    )
    if delta == 0.0:
        raise ValueError(
            "delta must be > 0 with accounting='charged' (the default); for pure DP (delta = 0) "
            "use accounting='paper', monitor='pure'"
        )
    if monitor not in MONITORS:
        raise ValueError(f"monitor must be one of {MONITORS}, got {monitor!r}")
    max_rounds = check_int(max_rounds, "max_rounds", low=1)
    max_calls = check_int(max_calls, "max_calls", low=1)
    max_passes = check_int(max_passes, "max_passes", low=1)
    zcdp_share = check_real(
        zcdp_share, "zcdp_share", low=0.0, high=1.0, low_open=True, high_open=True
    )
    init_share = check_real(init_share, "init_share", low=0.0, high=1.0, high_open=True)
    eta = 2.0 * zeta if eta is None else check_real(eta, "eta", low=0.0, low_open=True)
    certify_share = check_real(certify_share, "certify_share", low=0.0, high=1.0)
    m = n_queries + 1
    draws = max_rounds + 1
    if monitor == "approx":
        rho = max_rho(epsilon * zcdp_share, delta / 2.0)
        a = min(
            1.0,
            cal.calibrate_individual_charging(
                epsilon * (1.0 - zcdp_share), delta / 2.0, max_calls, NEIGHBOURS
            ),
        )
    else:
        rho_all = max_rho(epsilon, delta)
        rho = rho_all * zcdp_share
        a = math.sqrt(2.0 * rho_all * (1.0 - zcdp_share) / max_calls) / m
    init_sigma2 = (
        sensitivity_factor(NEIGHBOURS) / (2.0 * rho * init_share) if init_share > 0 else 0.0
    )
    sigma_n2 = draws / (2.0 * rho * (1.0 - init_share))
    margin, eta_margin = _monitor_margin(
        monitor, a, m, max_calls * m * max_passes, beta / 2.0, runs=max_calls
    )
    mass_margin = _dg_margin(sigma_n2, beta / (2.0 * draws))
    alpha0 = 2.0 * (1.0 + zeta) * margin
    alpha = max_rounds * alpha0 + alpha0 + mass_margin
    return PremPlan(
        "charged",
        monitor,
        epsilon,
        delta,
        beta,
        zeta,
        m,
        max_rounds,
        0,
        max_calls,
        max_passes,
        eta,
        a,
        m,
        "gaussian",
        sigma_n2,
        init_sigma2,
        margin,
        mass_margin,
        alpha0,
        alpha0,
        alpha,
        extra={
            "rho_zcdp": rho,
            "zcdp_share": zcdp_share,
            "init_share": init_share,
            "certify_share": certify_share,
            "eta_margin": eta_margin,
        },
    )


def max_rho(epsilon: float, delta: float) -> float:
    """Largest ρ with zcdp_to_approx_dp(ρ, δ) ≤ ε: the naive histogram's calibration with one step
    and Δ₂² = 1 returns σ² = 1/(2ρ)."""
    return 1.0 / (2.0 * cal.calibrate_naive(epsilon, delta, 1, "add_remove"))


def plan_privacy(plan: PremPlan) -> ApproxDP:
    """(ε, δ) recomputed from the plan's noise parameters alone (the calibration round trip)."""
    if plan.accounting == "paper":
        calls, rounds = plan.max_calls, plan.rounds
        if plan.monitor == "approx":
            eps_n = advanced_composition(plan.mass_param, rounds, plan.delta / 2.0)
            call = cal.outside_interval_privacy(plan.a, plan.extra["delta_call"], NEIGHBOURS)
            eps_f = advanced_composition(call.epsilon, calls, plan.delta / 4.0)
            return ApproxDP(eps_n + eps_f, plan.delta / 2.0 + calls * call.delta + plan.delta / 4.0)
        eps = (
            rounds * plan.mass_param
            + calls * cal.outside_interval_pure_privacy(plan.a, plan.gamma).epsilon
        )
        return ApproxDP(eps, 0.0)
    rho = _charged_zcdp_rho(plan)
    if plan.monitor == "approx":
        mon = cal.individual_charging_privacy(plan.a, plan.max_calls, plan.delta / 2.0, NEIGHBOURS)
        return ApproxDP(
            zcdp_to_approx_dp(rho, plan.delta / 2.0) + mon.epsilon, plan.delta / 2.0 + mon.delta
        )
    rho += plan.max_calls * (plan.a * plan.gamma) ** 2 / 2.0
    return ApproxDP(zcdp_to_approx_dp(rho, plan.delta), plan.delta)


def _charged_zcdp_rho(plan: PremPlan) -> float:
    """ρ of the noisy start (Δ₂² = 2 under replace) plus the max_rounds + 1 masses (Δ = 1)."""
    rho = (plan.rounds + 1) / (2.0 * plan.mass_param)
    if plan.init_sigma2 > 0:
        rho += sensitivity_factor(NEIGHBOURS) / (2.0 * plan.init_sigma2)
    return rho
