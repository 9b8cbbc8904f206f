"""The budget plan of a deployment and when each release spends it.

The horizon T is known up front, so each release's whole spend is planned at start and checked
against the deployment budget before anything runs (:func:`budget_plan` raises
``BudgetExceededError`` naming the releases). The ledger then records actual spends per step, on
this schedule (:func:`step_cost`):

* fixed window (Bun et al. 2024, Alg. 1): ρ_r/R at each update step t = k..T (R = T−k+1), 0 before k;
* cumulative (Bun et al. 2024, Alg. 2): counter b (budget ρ_b = ρ·w_b/Σw, the weights of the release's
  ``counter`` and the deployment's relation, pipeline.synth.cumulative.counter_weights) starts at
  t = b and its whole ρ_b is charged then — by time t at most Σ_{b≤t} ρ_b has been spent, so the ledger never lags
  behind what the released outputs could reveal;
* relative error (PREM, Ghazi et al., arXiv 2502.14809): one PREM per step with (ε_r/T, δ_r/T), charged at
  every step t = 1..T as the (ε, δ) its noise parameters imply (pipeline.stream.relative_error);
* heavy hitters and band monitors: their (ε, δ) guarantee covers the whole horizon and does not
  decompose per step, so all of it is charged at step 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.privacy.accounting import ApproxDP, BudgetPlan, PlannedRelease, PrivacyBudget, ZCDP
from pipeline.stream import relative_error

if TYPE_CHECKING:  # annotations only: pipeline.config imports this module (load_config checks the plan)
    from pipeline.config import Deployment

__all__ = ["privacy_budget", "budget_plan", "step_cost", "ZCDP_RELEASES", "APPROX_DP_RELEASES"]

# Which part of the deployment budget each release type spends: ρ (zCDP) or (ε, δ).
ZCDP_RELEASES = ("fixed_window", "cumulative")
APPROX_DP_RELEASES = ("heavy_hitters", "band_monitor", "relative_error")


def privacy_budget(deployment: Deployment) -> PrivacyBudget:
    b = deployment.budget
    return PrivacyBudget(rho=b.rho, epsilon=b.epsilon, delta=b.delta)


def budget_plan(deployment: Deployment) -> BudgetPlan:
    """The checked plan (raises ``BudgetExceededError`` naming the releases over budget)."""
    releases = [
        PlannedRelease(rel.name, share=rel.share, kind="approx_dp" if rel.type in APPROX_DP_RELEASES else "zcdp")
        for rel in deployment.releases
    ]
    return BudgetPlan(privacy_budget(deployment), releases).check()


def step_cost(deployment: Deployment, release, step: int, allotment) -> ZCDP | ApproxDP | None:
    """What ``release`` spends at ``step`` (None: nothing), on the schedule in the module docstring."""
    T = deployment.horizon
    if release.type == "fixed_window":
        k = release.window
        return ZCDP(allotment.rho / (T - k + 1)) if step >= k else None
    if release.type == "cumulative":
        from pipeline.synth.cumulative import counter_weights

        w = counter_weights(T, release.counter, deployment.neighbours)
        return ZCDP(float(allotment.rho * w[step - 1] / w.sum()))
    if release.type == "relative_error":
        return relative_error.step_cost(deployment, release, step, allotment)
    if release.type in APPROX_DP_RELEASES:
        return allotment if step == 1 else None
    raise ValueError(f"release {release.name!r}: unknown type {release.type!r}")


def planned_schedule(deployment: Deployment) -> dict[str, np.ndarray]:
    """Per release, the ρ (or ε) charged at each step 1..T — for docs and tests."""
    allot = budget_plan(deployment).allotments()
    out = {}
    for rel in deployment.releases:
        costs = [step_cost(deployment, rel, t, allot[rel.name]) for t in range(1, deployment.horizon + 1)]
        out[rel.name] = np.array([0.0 if c is None else (c.rho if isinstance(c, ZCDP) else c.epsilon) for c in costs])
    return out
