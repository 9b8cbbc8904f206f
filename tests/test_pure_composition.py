"""The composition of m ε₀-DP calls (pipeline/privacy/pure_composition.py) and the target-charging
calibrations that use it, recomputed independently: Google's dp_accounting privacy-loss-distribution
accountant for the worst-case ε₀-DP pair, a direct hockey-stick sum from scipy's Binomial pmf, and
negative binomial tails for the cap's failure probability."""

import pytest
from scipy import stats

from pipeline.monitors import calibration as cal
from pipeline.monitors.heavy_hitters import heavy_hitter_plan
from pipeline.privacy.pure_composition import (advanced_epsilon, optimal_delta, optimal_epsilon,
                                               tightest_epsilon, zcdp_epsilon)
from pipeline.synth.prem_privacy import charged_plan

from composition_support import PLD_GRID, direct_delta, direct_epsilon, pld_epsilon

CASES = [(0.028418, 42, 6.5e-7), (0.1, 200, 1e-6), (0.5, 10, 1e-5), (1.0, 3, 1e-3),
         (0.05, 26, 1e-8)]


@pytest.mark.parametrize("eps0,m,delta", CASES)
def test_optimal_composition_matches_the_pld_accountant(eps0, m, delta):
    ours = optimal_epsilon(eps0, m, delta)
    pld = pld_epsilon(eps0, m, delta)
    assert ours <= pld + 1e-9                     # never claims less than an upper bound allows
    assert ours >= pld - m * PLD_GRID - 1e-9       # and is that bound up to its discretisation


@pytest.mark.parametrize("eps0,m,delta", CASES)
def test_optimal_composition_against_a_direct_sum(eps0, m, delta):
    ours = optimal_epsilon(eps0, m, delta)
    assert direct_delta(eps0, m, ours) <= delta
    assert ours == pytest.approx(direct_epsilon(eps0, m, delta), rel=1e-6, abs=1e-9)
    for e in (0.0, 0.3 * m * eps0, ours):
        expected = direct_delta(eps0, m, e)
        assert optimal_delta(eps0, m, e) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("eps0,m,delta", CASES)
def test_the_tightest_is_the_optimal_and_never_above_the_others(eps0, m, delta):
    adv, z = advanced_epsilon(eps0, m, delta), zcdp_epsilon(eps0, m, delta)
    opt = optimal_epsilon(eps0, m, delta)
    assert opt <= z * (1 + 1e-12) and z <= adv * (1 + 1e-12) and opt <= m * eps0
    assert tightest_epsilon(eps0, m, delta).form == "optimal"


def test_the_issue_example_figures():
    """ε₀ = 0.028418, 42 calls, δ 6.5·10⁻⁷: advanced 1.000, zCDP/CKS 0.841, optimal 0.749."""
    assert advanced_epsilon(0.028418, 42, 6.5e-7) == pytest.approx(1.000, abs=5e-4)
    assert zcdp_epsilon(0.028418, 42, 6.5e-7) == pytest.approx(0.841, abs=5e-4)
    assert optimal_epsilon(0.028418, 42, 6.5e-7) == pytest.approx(0.749, abs=5e-4)


def _calls_beyond(m: int, hits: int, q: float) -> float:
    """P[more than m Bernoulli(q) trials until the hits-th success] (negative binomial)."""
    return float(stats.nbinom.sf(m - hits, hits, q))


def _recomputed(eps0: float, hits: int, bound: cal.TCTBound, delta: float) -> float:
    """ε of the bound's cap recomputed independently: δ* by the negative binomial, the rest of δ
    to the m pure calls through the PLD accountant."""
    m = int(bound.r)
    fail = _calls_beyond(m, hits, cal.not_prior_q(eps0))
    assert fail < delta
    return pld_epsilon(eps0, m, delta - fail)


def test_tct_heavy_hitter_example_reaches_the_goal_and_is_recomputed():
    """τ ≤ 1,560 at |X| = 10⁶, k = 3, horizon 10⁴, (ε, δ) = (1, 10⁻⁶) (advanced only: 1,833), and
    the calibrated ε₀'s privacy recomputed by dp_accounting is within the target."""
    plan = heavy_hitter_plan("tct", 10**6, 1, 1e-6, 3, 10**4, 0.05)
    assert plan["tau"] <= 1560
    eps0, hits = plan["epsilon0"], cal.tct_hits_per_user(3, "replace")
    bound = cal.individual_charging_privacy(eps0, 3, 1e-6, "replace")
    assert bound.delta <= 1e-6 * (1 + 1e-12)
    assert _recomputed(eps0, hits, bound, 1e-6) <= 1.0 + m_slack(bound)
    # the same ε₀ accounted with the advanced form only would exceed the target
    only_advanced = cal.TargetChargingAccountant(eps0, hits).best(1e-6, forms=("basic", "advanced"))
    assert only_advanced.epsilon > 1.0


def m_slack(bound: cal.TCTBound) -> float:
    return bound.r * PLD_GRID + 1e-9


@pytest.mark.parametrize("eps,delta,k", [(1.0, 1e-6, 3), (0.5, 1e-8, 20), (2.0, 1e-5, 1)])
def test_individual_charging_calibration_recomputed_by_the_pld_accountant(eps, delta, k):
    eps0 = cal.calibrate_individual_charging(eps, delta, k, "replace")
    bound = cal.individual_charging_privacy(eps0, k, delta, "replace")
    recomputed = _recomputed(eps0, cal.tct_hits_per_user(k, "replace"), bound, delta)
    assert recomputed <= eps + m_slack(bound)
    assert recomputed >= eps - m_slack(bound) - 1e-6  # calibrated to the target, not below it


def test_band_monitor_is_recalibrated_with_the_tightest_composition():
    a = cal.calibrate_outside_interval(1.0, 1e-6, "replace")
    bound = cal.outside_interval_privacy(a, 1e-6, "replace")
    assert _recomputed(a, 2, bound, 1e-6) <= 1.0 + m_slack(bound)
    only_basic_adv = cal.TargetChargingAccountant(a, 2).best(1e-6, forms=("basic", "advanced"))
    assert only_basic_adv.epsilon > 1.0


def test_prem_charged_monitor_part_is_recalibrated():
    plan = charged_plan(64, 10, 0.1, 1.0, 1e-6, 0.05)
    hits = 2 * plan.max_calls
    bound = cal.TargetChargingAccountant(plan.a, hits).best(1e-6 / 2)
    assert _recomputed(plan.a, hits, bound, 1e-6 / 2) <= 0.7 + m_slack(bound)
    accountant = cal.TargetChargingAccountant(plan.a, hits)
    only_basic_adv = accountant.best(1e-6 / 2, forms=("basic", "advanced"))
    assert only_basic_adv.epsilon > 0.7


def test_best_forms_are_validated():
    with pytest.raises(ValueError, match="forms"):
        cal.TargetChargingAccountant(0.1, 5).best(1e-6, forms=("fancy",))
