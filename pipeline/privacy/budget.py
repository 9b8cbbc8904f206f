"""A deployment's budget and the plan splitting it over the configured releases.

Model (docs/privacy.md): the privacy unit is one user's whole sequence of reports. A deployment sets a
budget once — ρ for the zCDP releases (synthesizers, tree counters) and (ε, δ) for the monitors —
and a :class:`BudgetPlan` splits it over the configured releases before anything runs
(:class:`pipeline.privacy.ledger.PrivacyLedger` then records every actual spend).

Float comparisons against the budget use a relative tolerance of :data:`BUDGET_RTOL` = 1e-12 so
that shares such as ten times 0.1 fill a budget exactly; nothing larger is forgiven.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.privacy.accountant import compose
from pipeline.privacy.checks import check_real
from pipeline.privacy.errors import BudgetExceededError, BudgetKindError
from pipeline.privacy.events import ZCDP, ApproxDP, Cost

__all__ = ["BUDGET_RTOL", "exceeds", "PrivacyBudget", "PlannedRelease", "BudgetPlan"]

#: Relative float tolerance when a spend is compared with a budget (see module docstring).
BUDGET_RTOL = 1e-12


def exceeds(spent: float, limit: float) -> bool:
    """Whether ``spent`` is beyond ``limit`` by more than the relative tolerance
    :data:`BUDGET_RTOL`."""
    return spent > limit * (1.0 + BUDGET_RTOL)


@dataclass(frozen=True)
class PrivacyBudget:
    """A deployment's budget: ``rho`` for zCDP releases, ``(epsilon, delta)`` for monitor releases.

    Either part may be None (not set); at least one must be set. ``epsilon`` and ``delta`` are set
    together (``delta`` = 0 for pure-DP monitors).
    """

    rho: float | None = None
    epsilon: float | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.rho is not None:
            object.__setattr__(self, "rho", check_real(self.rho, "rho", low_open=True))
        if (self.epsilon is None) != (self.delta is None):
            raise ValueError(
                "epsilon and delta must be set together (delta=0.0 for pure DP), "
                f"got epsilon={self.epsilon!r}, delta={self.delta!r}"
            )
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", check_real(self.epsilon, "epsilon", low_open=True))
            delta = check_real(self.delta, "delta", high=1.0)
            object.__setattr__(self, "delta", delta)
            if delta >= 1.0:
                raise ValueError(f"delta must be < 1, got {delta}")
        if self.rho is None and self.epsilon is None:
            raise ValueError("a budget needs rho or (epsilon, delta); all are None")

    def require(self, cost: Cost, who: str) -> None:
        """Raise :class:`BudgetKindError` if ``cost``'s kind is not budgeted (``who`` names the asker)."""
        if isinstance(cost, ZCDP) and self.rho is None:
            raise BudgetKindError(
                f"{who} asks for a zCDP budget (rho) but the deployment sets no rho"
            )
        if isinstance(cost, ApproxDP) and self.epsilon is None:
            raise BudgetKindError(
                f"{who} asks for an (epsilon, delta) budget but the deployment sets none"
            )

    def get_state(self) -> dict[str, Any]:
        return {"rho": self.rho, "epsilon": self.epsilon, "delta": self.delta}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PrivacyBudget:
        return cls(rho=state["rho"], epsilon=state["epsilon"], delta=state["delta"])


@dataclass(frozen=True)
class PlannedRelease:
    """A configured release and what it may spend over the whole horizon.

    Give exactly one of ``cost`` (an absolute :class:`ZCDP` / :class:`ApproxDP`) or ``share`` in
    (0, 1] together with ``kind`` (``"zcdp"``: ``share``·ρ; ``"approx_dp"``: ``share``·ε and
    ``share``·δ of the deployment budget).
    """

    name: str
    cost: Cost | None = None
    share: float | None = None
    kind: Literal["zcdp", "approx_dp"] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if (self.cost is None) == (self.share is None):
            raise ValueError(f"release {self.name!r}: give exactly one of cost or share")
        if self.cost is not None:
            if not isinstance(self.cost, (ZCDP, ApproxDP)):
                raise TypeError(
                    f"release {self.name!r}: cost must be ZCDP or ApproxDP, "
                    f"got {type(self.cost).__name__}"
                )
            if self.kind is not None:
                raise ValueError(f"release {self.name!r}: kind is only used with share")
        else:
            object.__setattr__(
                self,
                "share",
                check_real(self.share, f"share of release {self.name!r}", low_open=True, high=1.0),
            )
            if self.kind not in ("zcdp", "approx_dp"):
                raise ValueError(
                    f"release {self.name!r}: kind must be 'zcdp' or 'approx_dp' with share, "
                    f"got {self.kind!r}"
                )

    def allotment(self, budget: PrivacyBudget) -> Cost:
        """This release's cost under ``budget`` (raises :class:`BudgetKindError` if unbudgeted)."""
        if self.cost is not None:
            budget.require(self.cost, f"release {self.name!r}")
            return self.cost
        share = self.share
        assert share is not None  # __post_init__: exactly one of cost and share
        if self.kind == "zcdp":
            if budget.rho is None:
                raise BudgetKindError(
                    f"release {self.name!r} asks for a share of rho but the deployment sets no rho"
                )
            return ZCDP(share * budget.rho)
        if budget.epsilon is None or budget.delta is None:  # set together (PrivacyBudget)
            raise BudgetKindError(
                f"release {self.name!r} asks for a share of (epsilon, delta) "
                "but the deployment sets none"
            )
        return ApproxDP(share * budget.epsilon, share * budget.delta)


class BudgetPlan:
    """The releases of a deployment and their allotments; :meth:`check` refuses an over-budget plan."""

    def __init__(self, budget: PrivacyBudget, releases: Iterable[PlannedRelease]):
        if not isinstance(budget, PrivacyBudget):
            raise TypeError(f"budget must be a PrivacyBudget, got {type(budget).__name__}")
        self.budget = budget
        self.releases: tuple[PlannedRelease, ...] = tuple(releases)
        seen: set[str] = set()
        for r in self.releases:
            if not isinstance(r, PlannedRelease):
                raise TypeError(f"releases must be PlannedRelease, got {type(r).__name__}")
            if r.name in seen:
                raise ValueError(f"release name {r.name!r} appears twice in the plan")
            seen.add(r.name)

    def allotments(self) -> dict[str, Cost]:
        return {r.name: r.allotment(self.budget) for r in self.releases}

    def totals(self) -> tuple[ZCDP, ApproxDP]:
        return compose(self.allotments().values())

    def check(self) -> BudgetPlan:
        """Raise unless the plan fits the budget (relative tolerance :data:`BUDGET_RTOL`); return self."""
        allot = self.allotments()  # raises BudgetKindError naming the release
        rho_total, approx_total = compose(allot.values())
        b = self.budget
        problems: list[str] = []
        involved: list[str] = []
        if b.rho is not None and exceeds(rho_total.rho, b.rho):
            zcdp = {n: c for n, c in allot.items() if isinstance(c, ZCDP)}
            names = list(zcdp)
            involved += names
            parts = ", ".join(f"{n}: {c.rho:.6g}" for n, c in zcdp.items())
            problems.append(
                f"zCDP releases plan rho={rho_total.rho:.12g} > budget rho={b.rho:.12g} ({parts})"
            )
        if b.epsilon is not None and b.delta is not None:  # set together (PrivacyBudget)
            approx = {n: c for n, c in allot.items() if isinstance(c, ApproxDP)}
            names = list(approx)
            parts = ", ".join(f"{n}: ({c.epsilon:.6g}, {c.delta:.6g})" for n, c in approx.items())
            if exceeds(approx_total.epsilon, b.epsilon):
                involved += names
                problems.append(
                    f"(epsilon, delta) releases plan epsilon={approx_total.epsilon:.12g} > "
                    f"budget epsilon={b.epsilon:.12g} ({parts})"
                )
            if exceeds(approx_total.delta, b.delta):
                involved += [n for n in names if n not in involved]
                problems.append(
                    f"(epsilon, delta) releases plan delta={approx_total.delta:.12g} > "
                    f"budget delta={b.delta:.12g} ({parts})"
                )
        if problems:
            raise BudgetExceededError(
                "privacy plan exceeds the budget: " + "; ".join(problems), releases=involved
            )
        return self
