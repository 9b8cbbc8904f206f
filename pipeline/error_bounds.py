"""What an analyst gets from each release, known before anything runs: the padding, the error bound
each theorem gives at the release's β, and the whole planned spend as one (ε, δ).

Every number is read from the mechanism the releaser builds (the release's kind built from
:meth:`pipeline.releases.Setting.of` with the release's planned allotment) by the release's kind
(``bounds``, a :class:`pipeline.releases.bounds.ReleaseBounds`), never recomputed here:

* fixed window (Bun, Gaboardi, Neunhoeffer, Zhang, "Continual release of differentially private
  synthetic data from longitudinal data collections", arXiv 2306.07884, Theorem 3.2 /
  Corollary 3.1, generalised): ``n_pad`` padding records per length-k pattern and λ
  (``accuracy_bound``) — with probability ≥ 1 − β every projected count is within λ of its true
  count + n_pad, at every step;
* cumulative (same paper, Corollary B.1 recomputed with the counters' exact variances,
  ``CumulativeSynthesizer.error_bound``): every "at least b of t steps" count is within the bound,
  for all (b, t), with probability ≥ 1 − β;
* heavy hitters (Kaplan, Mansour, Stemmer, "The sparse vector technique, revisited", arXiv
  2011.07637, Definition 4.1 with the project's calibration, ``heavy_hitter_plan``): with
  probability ≥ 1 − β no element held by nobody is flagged and every element held by ≥ τ active
  users is flagged, at every step;
* band monitor (Ghazi et al., "PREM: Privately answering statistical queries with relative error",
  arXiv 2502.14809, Proposition 2.2 for discrete noise, ``BandMonitor.utility_margin``): with
  probability ≥ 1 − β over the horizon's steps an answer is wrong only for a count within the
  margin of the band's edges. A band release has no β of its own;
  :data:`pipeline.releases.bounds.BAND_BETA` is used.

A bound larger than the population n means the release says nothing reliable at that budget:
:func:`warnings` names it in one line per release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.privacy.accountant import compose, reported_approx_dp
from pipeline.privacy.events import ApproxDP
from pipeline.releases import Setting, kind_of
from pipeline.releases.bounds import ReleaseBounds

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["release_bounds", "planned_spend", "spend_as_approx_dp", "warnings"]


def release_bounds(deployment: Deployment, allotments: dict, n: int) -> dict[str, ReleaseBounds]:
    """Per release, the bounds of the mechanism built for ``n`` users with its planned allotment
    (``allotments``: :meth:`BudgetPlan.allotments`). Nothing is drawn that a release uses: the
    mechanisms are built with a throwaway secure source and never run."""
    out = {}
    for rel in deployment.releases:
        kind = kind_of(rel)
        mech = kind.build(rel, Setting.of(deployment, rel, allotments[rel.name], n=n, seed=None))
        out[rel.name] = kind.bounds(rel, mech, deployment.horizon)
    return out


def planned_spend(deployment: Deployment, allotments: dict) -> ApproxDP:
    """The whole horizon's planned spend as one (ε, δ), in the form manifests report it."""
    return spend_as_approx_dp(deployment, allotments.values())


def spend_as_approx_dp(deployment: Deployment, costs) -> ApproxDP:
    """``costs`` (ZCDP / ApproxDP, e.g. the ledger's entries) as one (ε, δ): their ρ converted at the
    deployment's ``budget.report_delta`` plus the monitors' (Σε, Σδ) — the manifests'
    ``deployment_spent_as_approx_dp``. Nothing is checked against the budget: this only reports."""
    rho, monitors = compose(costs)
    return reported_approx_dp(rho.rho, monitors, deployment.budget.report_delta)


def warnings(bounds: dict[str, ReleaseBounds], n: int) -> list[str]:
    """One line per release whose compared bound exceeds the population ``n``."""
    out = []
    for b in bounds.values():
        value = b.bounds[b.largest]
        if value > n:
            out.append(
                f"release {b.release!r}: {b.largest} = {value:,.1f} exceeds the population n = {n:,}, so at "
                f"this budget its {b.meaning} carries no information; raise the budget or its share"
            )
    return out
