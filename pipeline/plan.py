"""When each release of a deployment spends its share of the budget, and the seed it draws with.

The horizon T is known up front, so each release's whole spend is planned at start and checked
against the deployment budget before anything runs (``Deployment.budget_plan``, pipeline.config,
raises ``BudgetExceededError`` naming the releases). The ledger then records actual spends per
step, on this schedule (:func:`step_cost`), which is the privacy events each release's kind
declares from the noise parameters of its built mechanism (``pipeline.releases``: ``kind.events``):

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

from pipeline.privacy.events import ZCDP, ApproxDP
from pipeline.privacy.rng import derive_seed
from pipeline.releases import Setting, kind_of, kinds

if TYPE_CHECKING:
    from pipeline.releases import ReleaseConfig

if (
    TYPE_CHECKING
):  # annotations only: the plan works on any deployment model, and loads no YAML machinery
    from pipeline.config import Deployment

__all__ = [
    "ZCDP_RELEASES",
    "release_seed",
    "mechanism_setting",
    "planned_events",
    "step_cost",
    "planned_schedule",
    "spend_of_steps",
]

# The release kinds that spend the deployment's ρ (zCDP); the others spend its (ε, δ) (pipeline.releases).
ZCDP_RELEASES = tuple(name for name, kind in kinds().items() if kind.budget == "zcdp")


def release_seed(deployment: Deployment, release_name: str) -> int | None:
    """Per-release seed derived from the deployment seed (None = secure randomness)."""
    seed = deployment.random.seed  # set exactly when the kind is seeded (RandomSourceConfig)
    if deployment.random.kind != "seeded" or seed is None:
        return None
    return derive_seed(seed, release_name)


def mechanism_setting(
    deployment: Deployment, release: ReleaseConfig, allotment, n: int | None = None
) -> Setting:
    """What ``release``'s mechanism is built from besides its own keys (seeded per release)."""
    return Setting.of(
        deployment, release, allotment, n=n, seed=release_seed(deployment, release.name)
    )


def planned_events(
    deployment: Deployment, release: ReleaseConfig, allotment
) -> tuple[ZCDP | ApproxDP | None, ...]:
    """The privacy events of ``release`` at steps 1..T: those its kind declares for the mechanism
    built from ``allotment`` (the one the releaser builds), so the plan is the noise drawn."""
    setting = mechanism_setting(deployment, release, allotment, deployment.n)
    try:
        hash((release, setting))
    except TypeError:  # a release model holding a mapping (e.g. declared groups): built uncached
        return _events.__wrapped__(release, setting)
    return _events(release, setting)


@functools.lru_cache(maxsize=64)
def _events(release: ReleaseConfig, setting: Setting) -> tuple:
    kind = kind_of(release)
    return kind.events(release, kind.build(release, setting), setting)


def step_cost(
    deployment: Deployment, release: ReleaseConfig, step: int, allotment
) -> ZCDP | ApproxDP | None:
    """What ``release`` spends at ``step`` (None: nothing), on the schedule in the module docstring."""
    return planned_events(deployment, release, allotment)[step - 1]


def _amount_key(cost: ZCDP | ApproxDP) -> str:
    """What a spend is counted in: ρ for a zCDP event, ε for an (ε, δ) one."""
    return "rho" if isinstance(cost, ZCDP) else "epsilon"


def planned_schedule(deployment: Deployment) -> dict[str, np.ndarray]:
    """Per release, the ρ (or ε) charged at each step 1..T — for docs and tests."""
    allot = deployment.budget_plan().allotments()
    out = {}
    for rel in deployment.releases:
        costs = planned_events(deployment, rel, allot[rel.name])
        out[rel.name] = np.array([0.0 if c is None else getattr(c, _amount_key(c)) for c in costs])
    return out


def spend_of_steps(deployment: Deployment, steps) -> dict[str, dict[str, float]]:
    """Per release, what closing ``steps`` spends (ρ for zCDP releases, ε for (ε, δ) ones) and its
    share of the release's allotment; releases that spend nothing at these steps are left out."""
    allot = deployment.budget_plan().allotments()
    out = {}
    for rel in deployment.releases:
        events = planned_events(deployment, rel, allot[rel.name])
        costs = [c for c in (events[t - 1] for t in steps) if c is not None]
        if not costs:
            continue
        key = _amount_key(costs[0])
        spent = sum(getattr(c, key) for c in costs)
        out[rel.name] = {key: spent, "share_of_release": spent / getattr(allot[rel.name], key)}
    return out
