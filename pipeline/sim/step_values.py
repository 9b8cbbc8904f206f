"""One step of simulated reports for ``dpstream produce --simulate``: a code per roster user for
every attribute of the deployment (simulation only; refused on a production deployment).

* binary: the SIPP-like poverty chain (:func:`pipeline.sim.panel.simulate_poverty_panel`);
* categorical: values with persistence over the declared labels (kept with probability 0.9,
  otherwise redrawn uniformly), as :func:`pipeline.sim.panel.simulate_categorical_panel`;
* hashed: the same over the whole id domain, plus shifting heavy hitters — per phase of
  ``PHASE`` steps, ``HEAVY_PER_PHASE`` ids each held by ``HEAVY_SHARE`` of the users — so the
  heavy-hitter monitors have something to find (before: the poverty chain's 0/1 as ids).

Every call for the same seed draws the same panel, so the steps of separate ``produce`` calls
continue one another. Memory stays O(users) whatever the step: the chain is run forward one step
at a time (a loop over steps, vectorised over users).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.sim.panel import simulate_poverty_panel

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["simulated_step", "PERSISTENCE", "PHASE", "HEAVY_PER_PHASE", "HEAVY_SHARE"]

PERSISTENCE = 0.9
PHASE, HEAVY_PER_PHASE, HEAVY_SHARE = 3, 2, 0.04


def simulated_step(deployment: Deployment, n: int, step: int, seed: int) -> dict[str, np.ndarray]:
    """Attribute -> codes (one per roster row) of ``step`` (1-based), for every attribute."""
    out = {}
    for index, (name, attr) in enumerate(deployment.attributes.items()):
        if attr.type == "binary":
            rng = np.random.default_rng([seed, index])
            out[name] = simulate_poverty_panel(n=n, horizon=step, seed=rng)[:, step - 1]
        else:
            out[name] = _persistent_step(
                n, int(attr.size), step, [seed, index], planted=attr.type == "hashed"
            )
    return out


def _persistent_step(n: int, size: int, step: int, seed: list[int], planted: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    value = rng.integers(0, size, size=n)
    for _ in range(1, step):
        move = rng.random(n) >= PERSISTENCE
        value[move] = rng.integers(0, size, size=int(move.sum()))
    if planted:
        phase = (step - 1) // PHASE
        holders = int(round(HEAVY_SHARE * n))
        heavy = np.random.default_rng([*seed, phase])  # the same ids and holders all phase long
        if holders and holders * HEAVY_PER_PHASE <= n and size >= HEAVY_PER_PHASE:
            elements = heavy.choice(size, size=HEAVY_PER_PHASE, replace=False)
            groups = heavy.permutation(n)[: holders * HEAVY_PER_PHASE]
            groups = groups.reshape(HEAVY_PER_PHASE, holders)
            for element, group in zip(elements, groups):
                value[group] = element
    return value
