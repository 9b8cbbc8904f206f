"""Privacy costs as immutable values, in the spirit of the ``DpEvent`` of Google's dp_accounting.

Costs compose by addition (:mod:`pipeline.privacy.accountant` composes both kinds together):

* :class:`ZCDP` ``(ρ)``: zero-concentrated DP composes additively, ρ = Σ ρ_i
  (Bun & Steinke 2016, "Concentrated Differential Privacy", Lemma 2.3).
* :class:`ApproxDP` ``(ε, δ)``: basic composition, ε = Σ ε_i and δ = Σ δ_i
  (Dwork & Roth 2014, Theorem 3.16).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.privacy.checks import check_real
from pipeline.privacy.conversions import zcdp_to_approx_dp

__all__ = ["ZCDP", "ApproxDP", "Cost"]


@dataclass(frozen=True)
class ZCDP:
    """A ρ-zCDP cost. Composition adds ρ (Bun & Steinke 2016, Lemma 2.3)."""

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check_real(self.rho, "rho"))

    def __add__(self, other: ZCDP) -> ZCDP:
        if not isinstance(other, ZCDP):
            return NotImplemented
        return ZCDP(self.rho + other.rho)

    def scaled(self, factor: float) -> ZCDP:
        return ZCDP(self.rho * check_real(factor, "factor"))

    def to_approx_dp(self, delta: float) -> ApproxDP:
        """(ε, δ) implied by this cost at ``delta`` (see :func:`zcdp_to_approx_dp`)."""
        return ApproxDP(zcdp_to_approx_dp(self.rho, delta), delta)


@dataclass(frozen=True)
class ApproxDP:
    """An (ε, δ)-DP cost. Basic composition adds ε and δ (Dwork & Roth 2014, Theorem 3.16)."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_real(self.epsilon, "epsilon", allow_inf=True))
        object.__setattr__(self, "delta", check_real(self.delta, "delta", high=1.0))

    def __add__(self, other: ApproxDP) -> ApproxDP:
        if not isinstance(other, ApproxDP):
            return NotImplemented
        return ApproxDP(self.epsilon + other.epsilon, min(1.0, self.delta + other.delta))

    def scaled(self, factor: float) -> ApproxDP:
        f = check_real(factor, "factor")
        return ApproxDP(self.epsilon * f, min(1.0, self.delta * f))


Cost = ZCDP | ApproxDP
