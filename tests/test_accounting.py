"""Tests for the privacy accounting (pipeline.privacy: events, conversions, accountant, budget,
ledger): conversion, cross-checks, plans, ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.privacy.accountant import compose
from pipeline.privacy.budget import BUDGET_RTOL, BudgetPlan, PlannedRelease, PrivacyBudget
from pipeline.privacy.conversions import approx_dp_delta, classic_zcdp_to_approx_dp, zcdp_to_approx_dp
from pipeline.privacy.errors import (BudgetExceededError, BudgetExhaustedError, BudgetKindError,
                                     DuplicateLedgerEntryError)
from pipeline.privacy.events import ApproxDP, ZCDP
from pipeline.privacy.ledger import LedgerEntry, PrivacyLedger
from pipeline.privacy.neighbours import sensitivity_factor
from pipeline.serialization import dumps_state, loads_state

RHOS = [1e-4, 0.005, 0.1, 1.0, 10.0]
DELTAS = [1e-10, 1e-6, 1e-3]
GRID = [(r, d) for r in RHOS for d in DELTAS]


def _eps_at_alpha(rho, delta, alpha):
    """ε(α) of CKS 2020 Prop. 12 written directly (independent of the module's u-parametrisation)."""
    return alpha * rho + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


# -------------------------------------------------------------------------------- conversion


@pytest.mark.parametrize("rho,delta", GRID)
def test_conversion_is_the_minimum_over_alpha(rho, delta):
    eps = zcdp_to_approx_dp(rho, delta)
    # brute force over a dense log grid of α − 1: nothing on it beats ours (up to float rounding)
    alphas = 1.0 + np.logspace(-6, 7, 40001)
    brute = min(_eps_at_alpha(rho, delta, a) for a in alphas)
    assert eps <= brute * (1 + 1e-12)
    assert eps >= brute * (1 - 1e-6)  # dense grid gets within 1e-6 of the optimum


@pytest.mark.parametrize("rho,delta", GRID)
def test_conversion_beats_classic_bound(rho, delta):
    ours = zcdp_to_approx_dp(rho, delta)
    classic = classic_zcdp_to_approx_dp(rho, delta)
    assert classic == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    assert ours < classic


@pytest.mark.parametrize("rho,delta", GRID)
def test_delta_is_inverse_of_epsilon(rho, delta):
    eps = zcdp_to_approx_dp(rho, delta)
    assert approx_dp_delta(rho, eps) == pytest.approx(delta, rel=1e-9)
    # monotone: more ε, less δ
    assert approx_dp_delta(rho, eps * 1.01) < delta < approx_dp_delta(rho, eps * 0.99)


@pytest.mark.parametrize("rho", [1e-8, 1e-6, 1e-3, 1.0, 100.0, 1e3])
@pytest.mark.parametrize("delta", [1e-15, 1e-9, 1e-4, 0.1, 0.5])
def test_conversion_robust_over_wide_range(rho, delta):
    eps = zcdp_to_approx_dp(rho, delta)
    assert math.isfinite(eps) and eps >= 0.0
    assert eps <= classic_zcdp_to_approx_dp(rho, delta)
    if eps > 0:
        assert approx_dp_delta(rho, eps) == pytest.approx(delta, rel=1e-8)
    else:  # ε = 0 only when δ already covers the ε = 0 point
        assert approx_dp_delta(rho, 0.0) <= delta * (1 + 1e-12)


def test_conversion_monotone_in_rho_and_delta():
    rhos = np.logspace(-6, 2, 60)
    eps = [zcdp_to_approx_dp(r, 1e-6) for r in rhos]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    deltas = np.logspace(-14, -1, 60)
    eps = [zcdp_to_approx_dp(0.1, d) for d in deltas]
    assert all(a > b for a, b in zip(eps, eps[1:]))


def test_conversion_edge_cases():
    assert zcdp_to_approx_dp(0.0, 1e-6) == 0.0
    assert zcdp_to_approx_dp(0.5, 1.0) == 0.0
    assert zcdp_to_approx_dp(0.5, 0.0) == math.inf
    assert approx_dp_delta(0.0, 0.1) == 0.0
    assert approx_dp_delta(0.5, math.inf) == 0.0
    # KL/Bretagnolle–Huber branch: δ ≥ sqrt(1 − e^{−ρ}) gives ε = 0
    rho = 1e-6
    assert zcdp_to_approx_dp(rho, math.sqrt(-math.expm1(-rho)) * 1.0001) == 0.0
    assert approx_dp_delta(rho, 0.0) <= math.sqrt(-math.expm1(-rho))


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: zcdp_to_approx_dp(-1.0, 1e-6), "rho"),
        (lambda: zcdp_to_approx_dp(float("nan"), 1e-6), "rho"),
        (lambda: zcdp_to_approx_dp(math.inf, 1e-6), "rho"),
        (lambda: zcdp_to_approx_dp(0.1, -1e-6), "delta"),
        (lambda: zcdp_to_approx_dp(0.1, 1.5), "delta"),
        (lambda: zcdp_to_approx_dp(0.1, float("nan")), "delta"),
        (lambda: approx_dp_delta(0.1, -0.5), "epsilon"),
        (lambda: approx_dp_delta(-0.1, 0.5), "rho"),
    ],
)
def test_conversion_errors_name_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# -------------------------------------------------------------------------------- cross-checks


@pytest.mark.parametrize("rho,delta", GRID)
def test_cross_check_dp_accounting(rho, delta):
    dp_accounting = pytest.importorskip("dp_accounting")
    # ρ-zCDP ↔ Gaussian mechanism with sensitivity 1 and noise multiplier σ = 1/√(2ρ)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(2.0 * rho)))
    theirs = acc.get_epsilon(delta)
    ours = zcdp_to_approx_dp(rho, delta)
    # Same bound (CKS 2020 Prop. 12) over their finite order grid vs our exact optimum.
    assert ours <= theirs * (1 + 1e-12)
    assert ours >= theirs * (1 - 0.05)
    # With a dense order grid the two agree closely.
    orders = 1.0 + np.logspace(-4, 6, 20001)
    dense = dp_accounting.rdp.RdpAccountant(orders=orders)
    dense.compose(dp_accounting.ZCDpEvent(rho))
    theirs_dense = dense.get_epsilon(delta)
    assert ours <= theirs_dense * (1 + 1e-12)
    assert ours == pytest.approx(theirs_dense, rel=1e-6)
    # δ direction
    assert approx_dp_delta(rho, ours) <= dense.get_delta(ours) * (1 + 1e-9)


@pytest.mark.parametrize("rho,delta", GRID)
def test_cross_check_opendp(rho, delta):
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    # Gaussian with scale σ on a sensitivity-1 scalar is (1/σ)²/2 = ρ zCDP.
    scale = 1.0 / math.sqrt(2.0 * rho)
    meas = dp.m.make_gaussian(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale)
    assert meas.map(1.0) == pytest.approx(rho, rel=1e-12)
    profile = dp.c.make_zCDP_to_approxDP(meas).map(1.0)
    theirs = profile.epsilon(delta)
    ours = zcdp_to_approx_dp(rho, delta)
    # OpenDP evaluates the same bound with conservative (outward) rounding and α ≥ 1.01.
    assert ours <= theirs * (1 + 1e-12)
    assert ours == pytest.approx(theirs, rel=1e-6)
    assert approx_dp_delta(rho, ours) == pytest.approx(profile.delta(ours), rel=1e-6)


# -------------------------------------------------------------------------------- cost values


def test_cost_values_compose_and_are_immutable():
    assert ZCDP(0.1) + ZCDP(0.2) == ZCDP(0.1 + 0.2)
    assert ApproxDP(1.0, 1e-6) + ApproxDP(0.5, 1e-7) == ApproxDP(1.5, 1e-6 + 1e-7)
    z, a = compose([ZCDP(0.1), ApproxDP(1.0, 1e-6), ZCDP(0.3), ApproxDP(0.5, 0.0)])
    assert z.rho == pytest.approx(0.4) and a.epsilon == 1.5 and a.delta == 1e-6
    with pytest.raises(Exception):
        ZCDP(0.1).rho = 0.2  # frozen
    with pytest.raises(TypeError):
        ZCDP(0.1) + ApproxDP(1.0, 0.0)
    with pytest.raises(ValueError, match="rho"):
        ZCDP(-0.1)
    with pytest.raises(ValueError, match="delta"):
        ApproxDP(1.0, 2.0)
    with pytest.raises(ValueError, match="epsilon"):
        ApproxDP(float("nan"), 0.0)


def test_sensitivity_factor():
    assert sensitivity_factor("add_remove") == 1.0
    # replace: L2 sensitivity √2 of a histogram → ρ = (√2)²/(2σ²) = 2 · 1/(2σ²)
    assert sensitivity_factor("replace") == 2.0
    with pytest.raises(ValueError, match="neighbours"):
        sensitivity_factor("swap")


# -------------------------------------------------------------------------------- plan


def test_plan_shares_and_absolute_costs():
    budget = PrivacyBudget(rho=1.0, epsilon=2.0, delta=1e-6)
    plan = BudgetPlan(
        budget,
        [
            PlannedRelease("window", share=0.5, kind="zcdp"),
            PlannedRelease("cumulative", cost=ZCDP(0.5)),
            PlannedRelease("tme", share=0.75, kind="approx_dp"),
            PlannedRelease("band", cost=ApproxDP(0.5, 2.5e-7)),
        ],
    ).check()
    allot = plan.allotments()
    assert allot["window"] == ZCDP(0.5)
    assert allot["tme"] == ApproxDP(1.5, 0.75e-6)
    rho, approx = plan.totals()
    assert rho.rho == 1.0 and approx.epsilon == 2.0


def test_plan_of_many_float_shares_fits_exactly():
    budget = PrivacyBudget(rho=0.3)
    BudgetPlan(budget, [PlannedRelease(f"r{i}", share=0.1, kind="zcdp") for i in range(10)]).check()


def test_plan_exceeding_budget_is_refused_with_names_and_amounts():
    budget = PrivacyBudget(rho=1.0, epsilon=1.0, delta=1e-6)
    plan = BudgetPlan(budget, [PlannedRelease("a", share=0.6, kind="zcdp"),
                               PlannedRelease("b", cost=ZCDP(0.5)),
                               PlannedRelease("m", cost=ApproxDP(0.5, 0.0))])
    with pytest.raises(BudgetExceededError) as exc:
        plan.check()
    msg = str(exc.value)
    assert "a: 0.6" in msg and "b: 0.5" in msg and "rho=1.1" in msg
    assert set(exc.value.releases) == {"a", "b"}
    # the monitors alone fit; a delta overrun is named too
    plan = BudgetPlan(budget, [PlannedRelease("m1", cost=ApproxDP(0.5, 1e-6)),
                               PlannedRelease("m2", cost=ApproxDP(0.5, 1e-7))])
    with pytest.raises(BudgetExceededError, match="delta") as exc:
        plan.check()
    assert set(exc.value.releases) == {"m1", "m2"}


def test_plan_tolerance_is_tiny():
    budget = PrivacyBudget(rho=1.0)
    BudgetPlan(budget, [PlannedRelease("a", cost=ZCDP(1.0 + 0.5 * BUDGET_RTOL))]).check()
    with pytest.raises(BudgetExceededError):
        BudgetPlan(budget, [PlannedRelease("a", cost=ZCDP(1.0 + 1e-9))]).check()


def test_plan_refuses_unbudgeted_kind_naming_release():
    with pytest.raises(BudgetKindError, match="'mon'"):
        BudgetPlan(PrivacyBudget(rho=1.0), [PlannedRelease("mon", share=0.5, kind="approx_dp")]).check()
    with pytest.raises(BudgetKindError, match="'syn'"):
        BudgetPlan(PrivacyBudget(epsilon=1.0, delta=0.0), [PlannedRelease("syn", cost=ZCDP(0.1))]).check()


def test_budget_and_release_argument_errors():
    with pytest.raises(ValueError, match="rho"):
        PrivacyBudget(rho=0.0)
    with pytest.raises(ValueError, match="epsilon and delta"):
        PrivacyBudget(epsilon=1.0)
    with pytest.raises(ValueError, match="rho or"):
        PrivacyBudget()
    with pytest.raises(ValueError, match="delta"):
        PrivacyBudget(epsilon=1.0, delta=1.0)
    with pytest.raises(ValueError, match="share"):
        PlannedRelease("x", share=1.5, kind="zcdp")
    with pytest.raises(ValueError, match="exactly one"):
        PlannedRelease("x")
    with pytest.raises(ValueError, match="kind"):
        PlannedRelease("x", share=0.5)
    with pytest.raises(ValueError, match="twice"):
        BudgetPlan(PrivacyBudget(rho=1.0), [PlannedRelease("x", cost=ZCDP(0.1))] * 2)


# -------------------------------------------------------------------------------- ledger


def test_ledger_records_and_totals():
    budget = PrivacyBudget(rho=1.0, epsilon=1.0, delta=1e-6)
    led = PrivacyLedger(budget)
    for t in range(1, 11):
        led.record("syn", t, ZCDP(0.05), timestamp=float(t))
    led.record("mon", 1, ApproxDP(0.25, 1e-7))
    led.record("mon", 2, ApproxDP(0.25, 1e-7))
    assert len(led) == 12
    assert led.spent_rho() == pytest.approx(0.5)
    assert led.spent_rho("syn") == pytest.approx(0.5)
    assert led.spent_approx_dp() == ApproxDP(0.5, 2e-7)
    total_delta = 1e-6
    # split: δ_z = δ_total − Σδ_i
    expected = zcdp_to_approx_dp(0.5, total_delta - 2e-7) + 0.5
    assert led.total_epsilon(total_delta) == pytest.approx(expected, rel=1e-12)
    assert led.total_approx_dp(total_delta).delta == total_delta
    with pytest.raises(ValueError, match="delta"):
        led.total_epsilon(2e-7)  # nothing left for the zCDP part
    assert led.has("mon", 2) and not led.has("mon", 3)


def test_ledger_refuses_overspend_and_duplicates_without_changing():
    led = PrivacyLedger(PrivacyBudget(rho=0.1, epsilon=1.0, delta=0.0))
    led.record("syn", 1, ZCDP(0.06))
    with pytest.raises(BudgetExhaustedError, match=r"'syn' at step 2") as exc:
        led.record("syn", 2, ZCDP(0.06))
    assert exc.value.release == "syn" and exc.value.step == 2
    assert led.spent_rho() == 0.06 and len(led) == 1
    with pytest.raises(DuplicateLedgerEntryError, match=r"'syn' at step 1"):
        led.record("syn", 1, ZCDP(0.01))
    with pytest.raises(BudgetExhaustedError, match=r"'mon' at step 1"):
        led.record("mon", 1, ApproxDP(0.5, 1e-9))  # delta budget is 0
    led.record("mon", 1, ApproxDP(1.0, 0.0))
    with pytest.raises(BudgetKindError, match="'x'"):
        PrivacyLedger(PrivacyBudget(rho=1.0)).record("x", 1, ApproxDP(0.1, 0.0))


def test_ledger_enforces_plan_allotments():
    budget = PrivacyBudget(rho=1.0)
    plan = BudgetPlan(budget, [PlannedRelease("a", share=0.25, kind="zcdp"),
                               PlannedRelease("b", share=0.75, kind="zcdp")])
    led = PrivacyLedger(budget, plan)
    led.record("a", 1, ZCDP(0.25))
    with pytest.raises(BudgetExhaustedError, match="allotment"):
        led.record("a", 2, ZCDP(0.01))
    with pytest.raises(BudgetKindError, match="'c'"):
        led.record("c", 1, ZCDP(0.01))
    led.record("b", 1, ZCDP(0.75))


def test_ledger_state_round_trip():
    budget = PrivacyBudget(rho=1.0, epsilon=1.0, delta=1e-6)
    plan = BudgetPlan(budget, [PlannedRelease("syn", share=1.0, kind="zcdp"),
                               PlannedRelease("mon", cost=ApproxDP(1.0, 1e-6))])
    led = PrivacyLedger(budget, plan)
    led.record("syn", 1, ZCDP(0.1), timestamp=123.5)
    led.record("mon", 1, ApproxDP(0.1, 1e-8), timestamp=124.0)
    blob = dumps_state(led.get_state())
    back = PrivacyLedger.from_state(loads_state(blob))
    assert back.entries == led.entries
    assert back.budget == budget
    assert back.plan.allotments() == plan.allotments()
    assert dumps_state(back.get_state()) == blob
    with pytest.raises(DuplicateLedgerEntryError):
        back.record("syn", 1, ZCDP(0.1))
    assert LedgerEntry.from_state(led.entries[1].get_state()) == led.entries[1]
