"""The budget plan of a deployment and when each release spends it.

The horizon T is known up front, so each release's whole spend is planned at start and checked
against the deployment budget before anything runs (:func:`budget_plan` raises
``BudgetExceededError`` naming the releases). The ledger then records actual spends per step, on
this schedule (:func:`step_cost`), which is the privacy events each release's kind declares from
the noise parameters of its built mechanism (``pipeline.releases``: ``kind.events``):

* fixed window (Bun et al. 2024, Alg. 1): Δ²/(2σ²) = ρ_r/R at each update step t = k..T (R = T−k+1), 0 before k;
* cumulative (Bun et al. 2024, Alg. 2): counter b (budget ρ_b = ρ·w_b/Σw, the weights of the release's
  ``counter`` and the deployment's relation, pipeline.synth.cumulative.counter_weights) starts at
  t = b and its whole ρ_b (the Δ²/(2σ²) of its draws) is charged then — by time t at most
  Σ_{b≤t} ρ_b has been spent, so the ledger never lags behind what the released outputs could reveal;
* heavy hitters and band monitors: their (ε, δ) guarantee covers the whole horizon and does not
  decompose per step, so all of it is charged at step 1.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from pipeline.privacy.accounting import ApproxDP, BudgetPlan, PlannedRelease, PrivacyBudget, ZCDP
from pipeline.releases import Setting, kind_of, kinds

if TYPE_CHECKING:  # annotations only: pipeline.config imports this module (load_config checks the plan)
    from pipeline.config import Deployment

__all__ = ["privacy_budget", "budget_plan", "step_cost", "planned_events", "mechanism_setting", "ZCDP_RELEASES",
           "APPROX_DP_RELEASES"]

# Which part of the deployment budget each release kind spends: ρ (zCDP) or (ε, δ) (pipeline.releases).
ZCDP_RELEASES = tuple(name for name, kind in kinds().items() if kind.budget == "zcdp")
APPROX_DP_RELEASES = tuple(name for name, kind in kinds().items() if kind.budget == "approx_dp")


def privacy_budget(deployment: Deployment) -> PrivacyBudget:
    b = deployment.budget
    return PrivacyBudget(rho=b.rho, epsilon=b.epsilon, delta=b.delta)


def budget_plan(deployment: Deployment) -> BudgetPlan:
    """The checked plan (raises ``BudgetExceededError`` naming the releases over budget)."""
    releases = [
        PlannedRelease(rel.name, share=rel.share, kind=kind_of(rel).budget)
        for rel in deployment.releases
    ]
    return BudgetPlan(privacy_budget(deployment), releases).check()


def mechanism_setting(deployment: Deployment, release, allotment, n: int | None = None) -> Setting:
    """What ``release``'s mechanism is built from besides its own keys (seeded per release)."""
    from pipeline.stream.release.engine import release_seed

    return Setting(horizon=deployment.horizon, neighbours=deployment.neighbours,
                   domain_size=deployment.attributes[release.attribute].size, allotment=allotment,
                   seed=release_seed(deployment, release.name), n=n,
                   attribute=deployment.attributes[release.attribute])


def planned_events(deployment: Deployment, release, allotment) -> tuple[ZCDP | ApproxDP | None, ...]:
    """The privacy events of ``release`` at steps 1..T: those its kind declares for the mechanism
    built from ``allotment`` (the one the releaser builds), so the plan is the noise drawn."""
    setting = mechanism_setting(deployment, release, allotment, deployment.n)
    try:
        hash((release, setting))
    except TypeError:  # a release model holding a mapping (e.g. declared groups): built uncached
        return _events.__wrapped__(release, setting)
    return _events(release, setting)


@functools.lru_cache(maxsize=64)
def _events(release, setting: Setting) -> tuple:
    kind = kind_of(release)
    return kind.events(release, kind.build(release, setting), setting)


def step_cost(deployment: Deployment, release, step: int, allotment) -> ZCDP | ApproxDP | None:
    """What ``release`` spends at ``step`` (None: nothing), on the schedule in the module docstring."""
    return planned_events(deployment, release, allotment)[step - 1]


def planned_schedule(deployment: Deployment) -> dict[str, np.ndarray]:
    """Per release, the ρ (or ε) charged at each step 1..T — for docs and tests."""
    allot = budget_plan(deployment).allotments()
    out = {}
    for rel in deployment.releases:
        costs = [step_cost(deployment, rel, t, allot[rel.name]) for t in range(1, deployment.horizon + 1)]
        out[rel.name] = np.array([0.0 if c is None else (c.rho if isinstance(c, ZCDP) else c.epsilon) for c in costs])
    return out
