"""Composition of a whole spend and its report as one (ε, δ) pair.

Costs of the two kinds (:mod:`pipeline.privacy.events`) are composed apart — Σρ for the zCDP
releases (synthesizers, tree counters), (Σε, Σδ) for the monitors — by :func:`compose`.

Reporting the whole spend as one (ε, δ) pair (:func:`reported_approx_dp`,
:meth:`pipeline.privacy.ledger.PrivacyLedger.total_epsilon`): the zCDP part, ρ_total-zCDP, is
converted with :func:`~pipeline.privacy.conversions.zcdp_to_approx_dp` at δ_z, and composed with
the monitors' (Σε_i, Σδ_i) by basic composition. The caller chooses the total δ; the split is
**δ_total = δ_z + Σ δ_i**, i.e. the zCDP part gets whatever δ the monitors did not use.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.privacy.checks import check_real
from pipeline.privacy.conversions import zcdp_to_approx_dp
from pipeline.privacy.events import ZCDP, ApproxDP, Cost

__all__ = ["compose", "reported_approx_dp"]


def compose(costs: Iterable[Cost]) -> tuple[ZCDP, ApproxDP]:
    """Compose costs of both kinds: (Σρ, (Σε, Σδ)). Kinds are kept apart; see the module docstring
    for how they are reported together."""
    rho, eps, delta = 0.0, 0.0, 0.0
    for i, c in enumerate(costs):
        if isinstance(c, ZCDP):
            rho += c.rho
        elif isinstance(c, ApproxDP):
            eps += c.epsilon
            delta += c.delta
        else:
            raise TypeError(f"costs[{i}] must be ZCDP or ApproxDP, got {type(c).__name__}")
    return ZCDP(rho), ApproxDP(eps, min(1.0, delta))


def reported_approx_dp(rho: float, monitors: ApproxDP, report_delta: float) -> ApproxDP:
    """A whole spend as one (ε, δ), as manifests (``deployment_spent_as_approx_dp``), ``dpstream
    plan`` and ``dpstream status`` report it: ρ-zCDP converted at ``report_delta``
    (:func:`zcdp_to_approx_dp`), composed with the monitors' (Σε, Σδ) by basic composition, so
    ε = ε(ρ, report_delta) + Σε and δ = report_delta + Σδ (ρ = 0: the monitors' own (Σε, Σδ))."""
    if not isinstance(monitors, ApproxDP):
        raise TypeError(f"monitors must be an ApproxDP, got {type(monitors).__name__}")
    if check_real(rho, "rho") == 0.0:
        return monitors
    return ApproxDP(
        zcdp_to_approx_dp(rho, report_delta) + monitors.epsilon,
        min(1.0, report_delta + monitors.delta),
    )
