"""The spend ledger: every actual spend of a deployment, refused beyond its budget or allotment."""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.privacy.budget import BudgetPlan, PlannedRelease, PrivacyBudget, exceeds
from pipeline.privacy.checks import check_real
from pipeline.privacy.conversions import zcdp_to_approx_dp
from pipeline.privacy.errors import BudgetExhaustedError, BudgetKindError, DuplicateLedgerEntryError
from pipeline.privacy.events import ZCDP, ApproxDP, Cost

__all__ = ["LedgerEntry", "PrivacyLedger"]


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded spend: ``release`` spent ``cost`` at ``step``. (release, step) is the idempotence key."""

    release: str
    step: int
    cost: Cost
    timestamp: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.release, str) or not self.release:
            raise ValueError(f"release must be a non-empty str, got {self.release!r}")
        if (
            isinstance(self.step, bool)
            or not isinstance(self.step, numbers.Integral)
            or self.step < 0
        ):
            raise ValueError(f"step must be an int >= 0, got {self.step!r}")
        object.__setattr__(self, "step", int(self.step))
        if not isinstance(self.cost, (ZCDP, ApproxDP)):
            raise TypeError(f"cost must be ZCDP or ApproxDP, got {type(self.cost).__name__}")
        if self.timestamp is not None:
            object.__setattr__(self, "timestamp", check_real(self.timestamp, "timestamp"))

    def get_state(self) -> dict[str, Any]:
        c = self.cost
        cost = (
            {"kind": "zcdp", "rho": c.rho}
            if isinstance(c, ZCDP)
            else {"kind": "approx_dp", "epsilon": c.epsilon, "delta": c.delta}
        )
        return {
            "release": self.release,
            "step": self.step,
            "cost": cost,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LedgerEntry:
        c = state["cost"]
        if c["kind"] == "zcdp":
            cost: Cost = ZCDP(c["rho"])
        elif c["kind"] == "approx_dp":
            cost = ApproxDP(c["epsilon"], c["delta"])
        else:
            raise ValueError(f"unknown cost kind {c['kind']!r} in ledger state")
        return cls(state["release"], int(state["step"]), cost, state["timestamp"])


class PrivacyLedger:
    """Append-only record of actual spends against a :class:`PrivacyBudget`.

    :meth:`record` refuses (and leaves the ledger unchanged) an entry whose kind is not budgeted
    (:class:`BudgetKindError`), whose (release, step) is already recorded
    (:class:`DuplicateLedgerEntryError`), or that would take the total — or, when a ``plan`` is
    given, that release's own total — beyond its limit (:class:`BudgetExhaustedError`).
    """

    def __init__(
        self,
        budget: PrivacyBudget,
        plan: BudgetPlan | None = None,
        entries: Iterable[LedgerEntry] = (),
    ):
        if not isinstance(budget, PrivacyBudget):
            raise TypeError(f"budget must be a PrivacyBudget, got {type(budget).__name__}")
        if plan is not None and plan.budget != budget:
            raise ValueError("plan was made for a different budget than the ledger's")
        self.budget = budget
        self.plan = plan
        self._allot = plan.check().allotments() if plan is not None else None
        self._entries: list[LedgerEntry] = []
        self._keys: set[tuple[str, int]] = set()
        self._rho = 0.0
        self._eps = 0.0
        self._delta = 0.0
        self._by_release: dict[str, list[float]] = {}
        for e in entries:
            self.append(e)

    # -- recording --------------------------------------------------------------------------
    def record(
        self, release: str, step: int, cost: Cost, timestamp: float | None = None
    ) -> LedgerEntry:
        """Record ``release``'s spend at ``step`` (timestamp defaults to now, seconds since the epoch)."""
        entry = LedgerEntry(release, step, cost, time.time() if timestamp is None else timestamp)
        return self.append(entry)

    def append(self, entry: LedgerEntry) -> LedgerEntry:
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {type(entry).__name__}")
        who = f"release {entry.release!r} at step {entry.step}"
        key = (entry.release, entry.step)
        if key in self._keys:
            raise DuplicateLedgerEntryError(f"{who} is already in the ledger")
        self.budget.require(entry.cost, who)
        c = entry.cost
        mine = self._by_release.get(entry.release, [0.0, 0.0, 0.0])
        limit: Cost | None = None  # the release's allotment, when there is a plan; of c's kind
        if self._allot is not None:
            if entry.release not in self._allot:
                raise BudgetKindError(f"{who}: release {entry.release!r} is not in the plan")
            limit = self._allot[entry.release]
            if type(limit) is not type(c):
                raise BudgetKindError(
                    f"{who} spends {type(c).__name__} but its plan allots {type(limit).__name__}"
                )
        budget = self.budget
        if isinstance(c, ZCDP):
            assert budget.rho is not None  # require() refused a zCDP spend without a rho budget
            new_total = self._rho + c.rho
            if exceeds(new_total, budget.rho):
                raise BudgetExhaustedError(
                    f"{who} would spend rho={c.rho:.6g}: total {new_total:.12g} "
                    f"> budget rho={budget.rho:.12g}",
                    entry.release,
                    entry.step,
                )
            if isinstance(limit, ZCDP) and exceeds(mine[0] + c.rho, limit.rho):
                raise BudgetExhaustedError(
                    f"{who} would spend rho={c.rho:.6g}: release total "
                    f"{mine[0] + c.rho:.12g} > its allotment rho={limit.rho:.12g}",
                    entry.release,
                    entry.step,
                )
            self._rho = new_total
            mine = [mine[0] + c.rho, mine[1], mine[2]]
        else:
            # require() refused an (epsilon, delta) spend without that budget (set together)
            assert budget.epsilon is not None and budget.delta is not None
            new_eps, new_delta = self._eps + c.epsilon, self._delta + c.delta
            if exceeds(new_eps, budget.epsilon) or exceeds(new_delta, budget.delta):
                raise BudgetExhaustedError(
                    f"{who} would spend (epsilon, delta)=({c.epsilon:.6g}, {c.delta:.6g}): total "
                    f"({new_eps:.12g}, {new_delta:.12g}) > budget ({budget.epsilon:.12g}, "
                    f"{budget.delta:.12g})",
                    entry.release,
                    entry.step,
                )
            if isinstance(limit, ApproxDP) and (
                exceeds(mine[1] + c.epsilon, limit.epsilon)
                or exceeds(mine[2] + c.delta, limit.delta)
            ):
                raise BudgetExhaustedError(
                    f"{who} would spend (epsilon, delta)=({c.epsilon:.6g}, {c.delta:.6g}): release total "
                    f"({mine[1] + c.epsilon:.12g}, {mine[2] + c.delta:.12g}) > its allotment "
                    f"({limit.epsilon:.12g}, {limit.delta:.12g})",
                    entry.release,
                    entry.step,
                )
            self._eps, self._delta = new_eps, new_delta
            mine = [mine[0], mine[1] + c.epsilon, mine[2] + c.delta]
        self._by_release[entry.release] = mine
        self._entries.append(entry)
        self._keys.add(key)
        return entry

    # -- reading ----------------------------------------------------------------------------
    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def has(self, release: str, step: int) -> bool:
        return (release, step) in self._keys

    def spent_rho(self, release: str | None = None) -> float:
        """Σρ over the zCDP entries (of one release if ``release`` is given)."""
        if release is not None:
            return self._by_release.get(release, [0.0, 0.0, 0.0])[0]
        return self._rho

    def spent_approx_dp(self, release: str | None = None) -> ApproxDP:
        """(Σε, Σδ) over the (ε, δ) entries (basic composition)."""
        if release is not None:
            _, e, d = self._by_release.get(release, [0.0, 0.0, 0.0])
            return ApproxDP(e, min(1.0, d))
        return ApproxDP(self._eps, min(1.0, self._delta))

    def total_epsilon(self, delta: float) -> float:
        """ε of the whole spend reported at total ``delta``.

        Split: δ_z = ``delta`` − Σδ_i goes to the zCDP part, whose ρ_total is converted with
        :func:`zcdp_to_approx_dp`; then ε = ε(ρ_total, δ_z) + Σε_i (basic composition), so the whole
        spend is (ε, ``delta``)-DP. ``delta`` must be ≥ Σδ_i, and > Σδ_i when any ρ was spent
        (otherwise the answer would be infinite).
        """
        delta = check_real(delta, "delta", high=1.0)
        mon = self.spent_approx_dp()
        delta_z = delta - mon.delta
        if delta_z < 0.0 or (delta_z == 0.0 and self._rho > 0.0):
            raise ValueError(
                f"delta={delta:.6g} leaves nothing for the zCDP part: the monitors "
                f"already used delta={mon.delta:.6g}"
            )
        return zcdp_to_approx_dp(self._rho, delta_z) + mon.epsilon

    def total_approx_dp(self, delta: float) -> ApproxDP:
        """The whole spend as an :class:`ApproxDP` at total ``delta`` (see :meth:`total_epsilon`)."""
        return ApproxDP(self.total_epsilon(delta), delta)

    # -- state ------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Budget, optional plan and entries; serialisable with :mod:`pipeline.serialization`."""
        plan = None
        if self.plan is not None:
            plan = [
                {
                    "name": r.name,
                    "share": r.share,
                    "kind": r.kind,
                    "cost": None
                    if r.cost is None
                    else LedgerEntry(r.name, 0, r.cost).get_state()["cost"],
                }
                for r in self.plan.releases
            ]
        return {
            "budget": self.budget.get_state(),
            "plan": plan,
            "entries": [e.get_state() for e in self._entries],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PrivacyLedger:
        budget = PrivacyBudget.from_state(state["budget"])
        plan = None
        if state.get("plan") is not None:
            releases = []
            for r in state["plan"]:
                cost = None
                if r["cost"] is not None:
                    cost = LedgerEntry.from_state(
                        {"release": r["name"], "step": 0, "cost": r["cost"], "timestamp": None}
                    ).cost
                releases.append(
                    PlannedRelease(r["name"], cost=cost, share=r["share"], kind=r["kind"])
                )
            plan = BudgetPlan(budget, releases)
        return cls(budget, plan, [LedgerEntry.from_state(e) for e in state["entries"]])
