"""Privacy accounting: cost values, zCDP -> (ε, δ) conversion, budget plans and the spend ledger.

Model (docs/privacy.md): the privacy unit is one user's whole sequence of reports. A deployment sets a
budget once — ρ for the zCDP releases (synthesizers, tree counters) and (ε, δ) for the monitors —
and a :class:`BudgetPlan` splits it over the configured releases before anything runs. A
:class:`PrivacyLedger` then records every actual spend and refuses anything beyond the budget.

Costs are immutable values that compose by addition:

* :class:`ZCDP` ``(ρ)``: zero-concentrated DP composes additively, ρ = Σ ρ_i
  (Bun & Steinke 2016, "Concentrated Differential Privacy", Lemma 2.3).
* :class:`ApproxDP` ``(ε, δ)``: basic composition, ε = Σ ε_i and δ = Σ δ_i
  (Dwork & Roth 2014, Theorem 3.16).

Reporting the whole spend as one (ε, δ) pair (:meth:`PrivacyLedger.total_epsilon`): the zCDP part,
ρ_total-zCDP, is converted with :func:`zcdp_to_approx_dp` at δ_z, and composed with the monitors'
(Σε_i, Σδ_i) by basic composition. The caller chooses the total δ; the split is
**δ_total = δ_z + Σ δ_i**, i.e. the zCDP part gets whatever δ the monitors did not use.

Float comparisons against the budget use a relative tolerance of :data:`BUDGET_RTOL` = 1e-12 so
that shares such as ten times 0.1 fill a budget exactly; nothing larger is forgiven.
"""

from __future__ import annotations

import enum
import math
import numbers
import time
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence, Union

from pipeline.privacy.roots import increasing_root

__all__ = [
    "BUDGET_RTOL",
    "Neighbours",
    "NEIGHBOURS",
    "check_neighbours",
    "sensitivity_factor",
    "ZCDP",
    "ApproxDP",
    "Cost",
    "compose",
    "zcdp_to_approx_dp",
    "approx_dp_delta",
    "classic_zcdp_to_approx_dp",
    "reported_approx_dp",
    "PrivacyBudgetError",
    "BudgetExceededError",
    "BudgetExhaustedError",
    "BudgetKindError",
    "DuplicateLedgerEntryError",
    "PrivacyBudget",
    "PlannedRelease",
    "BudgetPlan",
    "LedgerEntry",
    "PrivacyLedger",
]

#: Relative float tolerance when a spend is compared with a budget (see module docstring).
BUDGET_RTOL = 1e-12

# --------------------------------------------------------------------------------------------
# Neighbouring relation
# --------------------------------------------------------------------------------------------

class Neighbours(enum.StrEnum):
    """Which datasets are neighbours; the privacy unit is one user's whole report sequence.

    * ``REPLACE`` (``"replace"``): one user's sequence is replaced by any other sequence of the
      domain, including the all-missing one. The only coherent relation for a stream deployment:
      the roster is fixed and public and a user without reports is imputed, so an "absent" user's
      count moves from its real bin to the imputed bin (−1 in one bin, +1 in another) and n is
      unchanged (the cumulative release publishes it exactly). ``pipeline.config`` refuses anything
      else for a deployment (docs/privacy.md, "Unit of privacy and neighbouring relation").
    * ``ADD_REMOVE`` (``"add_remove"``): one user's sequence is present or absent. Coherent only
      for batch use where the unit really disappears from every histogram and n is not published.

    Mechanisms accept the enum or its string value (normalised by :func:`check_neighbours`).
    """

    ADD_REMOVE = "add_remove"
    REPLACE = "replace"


NEIGHBOURS: tuple[str, ...] = tuple(m.value for m in Neighbours)


def check_neighbours(neighbours: Any, name: str = "neighbours") -> Neighbours:
    """Normalise ``neighbours`` (a :class:`Neighbours` member or its string value) to the enum;
    anything else raises ValueError naming the argument ``name``."""
    try:
        return Neighbours(neighbours)
    except ValueError:
        raise ValueError(f"{name} must be one of {NEIGHBOURS}, got {neighbours!r}") from None


def sensitivity_factor(neighbours: Neighbours | str) -> float:
    """Multiplier on ρ (equivalently on σ² for a fixed ρ) of a histogram release.

    A histogram with Gaussian noise of variance σ² per bin is Δ₂²/(2σ²)-zCDP, Δ₂ its L2 sensitivity
    (Bun & Steinke 2016, Proposition 1.6). One user's report at a step sits in one bin:

    * ``add_remove``: one bin changes by 1, Δ₂² = 1 → factor 1;
    * ``replace``: one bin loses 1 and another gains 1, Δ₂² = 2 → factor 2 (twice the ρ for the
      same noise, or twice the σ² for the same ρ).
    """
    return 1.0 if check_neighbours(neighbours) is Neighbours.ADD_REMOVE else 2.0


# --------------------------------------------------------------------------------------------
# Cost values
# --------------------------------------------------------------------------------------------


def _check_real(value: Any, name: str, *, low: float = 0.0, high: float = math.inf,
                low_open: bool = False, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be nan")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {v}")
    if v < low or (low_open and v == low) or v > high:
        lo = "(" if low_open else "["
        raise ValueError(f"{name} must be in {lo}{low}, {high}], got {v}")
    return v


@dataclass(frozen=True)
class ZCDP:
    """A ρ-zCDP cost. Composition adds ρ (Bun & Steinke 2016, Lemma 2.3)."""

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _check_real(self.rho, "rho"))

    def __add__(self, other: "ZCDP") -> "ZCDP":
        if not isinstance(other, ZCDP):
            return NotImplemented
        return ZCDP(self.rho + other.rho)

    def scaled(self, factor: float) -> "ZCDP":
        return ZCDP(self.rho * _check_real(factor, "factor"))

    def to_approx_dp(self, delta: float) -> "ApproxDP":
        """(ε, δ) implied by this cost at ``delta`` (see :func:`zcdp_to_approx_dp`)."""
        return ApproxDP(zcdp_to_approx_dp(self.rho, delta), delta)


@dataclass(frozen=True)
class ApproxDP:
    """An (ε, δ)-DP cost. Basic composition adds ε and δ (Dwork & Roth 2014, Theorem 3.16)."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_real(self.epsilon, "epsilon", allow_inf=True))
        object.__setattr__(self, "delta", _check_real(self.delta, "delta", high=1.0))

    def __add__(self, other: "ApproxDP") -> "ApproxDP":
        if not isinstance(other, ApproxDP):
            return NotImplemented
        return ApproxDP(self.epsilon + other.epsilon, min(1.0, self.delta + other.delta))

    def scaled(self, factor: float) -> "ApproxDP":
        f = _check_real(factor, "factor")
        return ApproxDP(self.epsilon * f, min(1.0, self.delta * f))


Cost = Union[ZCDP, ApproxDP]


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


# --------------------------------------------------------------------------------------------
# zCDP -> (ε, δ)
# --------------------------------------------------------------------------------------------
#
# Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy", Proposition 12
# / Corollary 13: a ρ-zCDP mechanism is (ε, δ)-DP for every α > 1 with
#
#     δ(α, ε) = exp((α−1)(αρ − ε)) / (α−1) · (1 − 1/α)^α ,
#     ln δ(α, ε) = A(α) − (α−1)ε,   A(α) = (α−1)αρ + α ln(1 − 1/α) − ln(α−1).
#
# δ for a given ε: d/dα ln δ = (2α−1)ρ − ε + ln(1 − 1/α) is increasing in α (ln δ is convex), so
# the optimal α is the unique root of (2α−1)ρ + ln(1 − 1/α) = ε.
#
# ε for a given δ: ε(α) = (A(α) − ln δ)/(α−1). Its derivative has the sign of
# g(α) = (α−1)A'(α) − A(α) + ln δ = (α−1)²ρ + ln α − ln(1/δ), and g' = (α−1)A''(α) > 0, so the
# optimal α is the unique root of (α−1)²ρ + ln α = ln(1/δ), where ε(α) = A'(α) = (2α−1)ρ + ln(1−1/α).
#
# Both roots are found in u = ln(α−1) (α = 1 + e^u), which keeps α → 1 (large ρ) and α ≫ 1
# (tiny ρ) equally well conditioned. Any α gives a valid bound, so root-finding error only makes
# the answer (very slightly) less tight, never invalid; float rounding is not made conservative.
#
# Second valid bound, used when better (as dp_accounting does): ρ-zCDP gives KL ≤ ρ (D_α ≤ αρ for
# α → 1), the Bretagnolle–Huber inequality gives TV ≤ sqrt(1 − e^{−KL}), and TV ≤ δ is exactly
# (0, δ)-DP. So δ ≥ sqrt(1 − e^{−ρ}) ⇒ ε = 0.


_RTOL = 4.0 * 2.0**-52  # the root to 4 ulps (scipy.optimize.brentq's smallest allowed rtol)


def _log1pexp(u: float) -> float:
    """ln(1 + e^u) without overflow (= ln α for α = 1 + e^u)."""
    return u + math.log1p(math.exp(-u)) if u > 0 else math.log1p(math.exp(u))


def _kl_delta(rho: float) -> float:
    return math.sqrt(-math.expm1(-rho))


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """Smallest ε such that every ρ-zCDP mechanism is (ε, δ)-DP by CKS 2020 Prop. 12 / Cor. 13.

    ε = min_{α>1} [αρ + ln(1 − 1/α) − (ln δ + ln α)/(α − 1)], attained at the root α* of
    (α−1)²ρ + ln α = ln(1/δ), where ε = (2α*−1)ρ + ln(1 − 1/α*) (derivation in the comment above).
    Also ε = 0 when δ ≥ sqrt(1 − e^{−ρ}) (KL ≤ ρ and Bretagnolle–Huber). Never larger than the
    classic ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Proposition 1.3).

    ``rho`` ≥ 0 (finite), ``delta`` in [0, 1]. ρ = 0 → 0; δ = 0 with ρ > 0 → inf; δ = 1 → 0.
    """
    rho = _check_real(rho, "rho")
    delta = _check_real(delta, "delta", high=1.0)
    if rho == 0.0 or delta == 1.0:
        return 0.0
    if delta == 0.0:
        return math.inf
    if delta >= _kl_delta(rho):
        return 0.0
    log_inv_delta = -math.log(delta)

    def g(u: float) -> float:  # (α−1)²ρ + ln α − ln(1/δ), increasing in u
        return math.exp(2.0 * u) * rho + _log1pexp(u) - log_inv_delta

    # Bracket: ln α ≤ α − 1 = e^u, so g < 0 once e^{2u}ρ and e^u are both ≤ ln(1/δ)/2;
    # g > 0 once e^{2u}ρ > ln(1/δ).
    u_lo = min(0.5 * math.log(log_inv_delta / (2.0 * rho)), math.log(log_inv_delta / 2.0)) - 1.0
    u_hi = 0.5 * math.log(log_inv_delta / rho) + 1.0
    u = increasing_root(g, u_lo, u_hi, xtol=1e-15, rtol=_RTOL)
    # ε(α) is flat at α*, so evaluating the defining formula at α* is the accurate way to read it.
    alpha_m1 = math.exp(u)
    log_alpha = _log1pexp(u)
    eps = (1.0 + alpha_m1) * rho + (u - log_alpha) - (-log_inv_delta + log_alpha) / alpha_m1
    return max(0.0, eps)


def approx_dp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ such that every ρ-zCDP mechanism is (ε, δ)-DP (inverse of :func:`zcdp_to_approx_dp`).

    δ = min(1, sqrt(1 − e^{−ρ}), min_{α>1} exp((α−1)(αρ − ε)) / (α−1) · (1 − 1/α)^α), the inner
    minimum at the root of (2α−1)ρ + ln(1 − 1/α) = ε (CKS 2020 Prop. 12 / Cor. 13).
    ``rho`` ≥ 0 (finite), ``epsilon`` ≥ 0 (inf allowed → 0).
    """
    rho = _check_real(rho, "rho")
    epsilon = _check_real(epsilon, "epsilon", allow_inf=True)
    if rho == 0.0 or math.isinf(epsilon):
        return 0.0

    def h(u: float) -> float:  # (2α−1)ρ + ln(1 − 1/α) − ε, increasing in u
        return (1.0 + 2.0 * math.exp(u)) * rho + (u - _log1pexp(u)) - epsilon

    # Bracket: for u ≤ 0, h ≤ 3ρ + u − ε; for u ≥ 0, ln(1 − 1/α) ≥ −ln 2.
    u_lo = min(0.0, epsilon - 3.0 * rho) - 1.0
    u_hi = max(0.0, math.log((epsilon + 1.0) / (2.0 * rho))) + 1.0
    u = increasing_root(h, u_lo, u_hi, xtol=1e-15, rtol=_RTOL)
    alpha_m1 = math.exp(u)
    log_1m_inv_alpha = u - _log1pexp(u)
    log_delta = alpha_m1 * ((1.0 + alpha_m1) * rho - epsilon) + (1.0 + alpha_m1) * log_1m_inv_alpha - u
    return min(1.0, math.exp(log_delta), _kl_delta(rho))


def classic_zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Proposition 1.3): valid but looser; for comparison."""
    rho = _check_real(rho, "rho")
    delta = _check_real(delta, "delta", low=0.0, low_open=True, high=1.0)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def reported_approx_dp(rho: float, monitors: ApproxDP, report_delta: float) -> ApproxDP:
    """A whole spend as one (ε, δ), as manifests (``deployment_spent_as_approx_dp``), ``dpstream
    plan`` and ``dpstream status`` report it: ρ-zCDP converted at ``report_delta``
    (:func:`zcdp_to_approx_dp`), composed with the monitors' (Σε, Σδ) by basic composition, so
    ε = ε(ρ, report_delta) + Σε and δ = report_delta + Σδ (ρ = 0: the monitors' own (Σε, Σδ))."""
    if not isinstance(monitors, ApproxDP):
        raise TypeError(f"monitors must be an ApproxDP, got {type(monitors).__name__}")
    if _check_real(rho, "rho") == 0.0:
        return monitors
    return ApproxDP(zcdp_to_approx_dp(rho, report_delta) + monitors.epsilon, min(1.0, report_delta + monitors.delta))


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class PrivacyBudgetError(ValueError):
    """Base class of budget errors (a ValueError, so configuration validation catches it)."""


class BudgetExceededError(PrivacyBudgetError):
    """A plan asks for more than the deployment's budget. ``releases`` names the releases involved."""

    def __init__(self, message: str, releases: Sequence[str] = ()):
        super().__init__(message)
        self.releases = tuple(releases)


class BudgetExhaustedError(PrivacyBudgetError):
    """A ledger entry would take the spend beyond the budget (or the release's allotment)."""

    def __init__(self, message: str, release: str, step: int):
        super().__init__(message)
        self.release = release
        self.step = step


class BudgetKindError(PrivacyBudgetError):
    """A release asks for a kind of budget (ρ or (ε, δ)) the deployment did not set."""


class DuplicateLedgerEntryError(PrivacyBudgetError):
    """A (release, step) pair is already in the ledger: the spend happened once, it is never re-recorded."""


# --------------------------------------------------------------------------------------------
# Budget and plan
# --------------------------------------------------------------------------------------------


def _exceeds(spent: float, limit: float) -> bool:
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
            object.__setattr__(self, "rho", _check_real(self.rho, "rho", low_open=True))
        if (self.epsilon is None) != (self.delta is None):
            raise ValueError("epsilon and delta must be set together (delta=0.0 for pure DP), "
                             f"got epsilon={self.epsilon!r}, delta={self.delta!r}")
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", _check_real(self.epsilon, "epsilon", low_open=True))
            object.__setattr__(self, "delta", _check_real(self.delta, "delta", high=1.0))
            if self.delta >= 1.0:
                raise ValueError(f"delta must be < 1, got {self.delta}")
        if self.rho is None and self.epsilon is None:
            raise ValueError("a budget needs rho or (epsilon, delta); all are None")

    def require(self, cost: Cost, who: str) -> None:
        """Raise :class:`BudgetKindError` if ``cost``'s kind is not budgeted (``who`` names the asker)."""
        if isinstance(cost, ZCDP) and self.rho is None:
            raise BudgetKindError(f"{who} asks for a zCDP budget (rho) but the deployment sets no rho")
        if isinstance(cost, ApproxDP) and self.epsilon is None:
            raise BudgetKindError(f"{who} asks for an (epsilon, delta) budget but the deployment sets none")

    def get_state(self) -> dict[str, Any]:
        return {"rho": self.rho, "epsilon": self.epsilon, "delta": self.delta}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "PrivacyBudget":
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
                raise TypeError(f"release {self.name!r}: cost must be ZCDP or ApproxDP, "
                                f"got {type(self.cost).__name__}")
            if self.kind is not None:
                raise ValueError(f"release {self.name!r}: kind is only used with share")
        else:
            object.__setattr__(self, "share", _check_real(self.share, f"share of release {self.name!r}",
                                                          low_open=True, high=1.0))
            if self.kind not in ("zcdp", "approx_dp"):
                raise ValueError(f"release {self.name!r}: kind must be 'zcdp' or 'approx_dp' with share, "
                                 f"got {self.kind!r}")

    def allotment(self, budget: PrivacyBudget) -> Cost:
        """This release's cost under ``budget`` (raises :class:`BudgetKindError` if unbudgeted)."""
        if self.cost is not None:
            budget.require(self.cost, f"release {self.name!r}")
            return self.cost
        if self.kind == "zcdp":
            if budget.rho is None:
                raise BudgetKindError(f"release {self.name!r} asks for a share of rho but the deployment sets no rho")
            return ZCDP(self.share * budget.rho)
        if budget.epsilon is None:
            raise BudgetKindError(f"release {self.name!r} asks for a share of (epsilon, delta) "
                                  "but the deployment sets none")
        return ApproxDP(self.share * budget.epsilon, self.share * budget.delta)


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

    def check(self) -> "BudgetPlan":
        """Raise unless the plan fits the budget (relative tolerance :data:`BUDGET_RTOL`); return self."""
        allot = self.allotments()  # raises BudgetKindError naming the release
        rho_total, approx_total = compose(allot.values())
        b = self.budget
        problems: list[str] = []
        involved: list[str] = []
        if b.rho is not None and _exceeds(rho_total.rho, b.rho):
            names = [n for n, c in allot.items() if isinstance(c, ZCDP)]
            involved += names
            parts = ", ".join(f"{n}: {allot[n].rho:.6g}" for n in names)
            problems.append(f"zCDP releases plan rho={rho_total.rho:.12g} > budget rho={b.rho:.12g} ({parts})")
        if b.epsilon is not None:
            names = [n for n, c in allot.items() if isinstance(c, ApproxDP)]
            parts = ", ".join(f"{n}: ({allot[n].epsilon:.6g}, {allot[n].delta:.6g})" for n in names)
            if _exceeds(approx_total.epsilon, b.epsilon):
                involved += names
                problems.append(f"(epsilon, delta) releases plan epsilon={approx_total.epsilon:.12g} > "
                                f"budget epsilon={b.epsilon:.12g} ({parts})")
            if _exceeds(approx_total.delta, b.delta):
                involved += [n for n in names if n not in involved]
                problems.append(f"(epsilon, delta) releases plan delta={approx_total.delta:.12g} > "
                                f"budget delta={b.delta:.12g} ({parts})")
        if problems:
            raise BudgetExceededError("privacy plan exceeds the budget: " + "; ".join(problems),
                                      releases=involved)
        return self


# --------------------------------------------------------------------------------------------
# Ledger
# --------------------------------------------------------------------------------------------


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
        if isinstance(self.step, bool) or not isinstance(self.step, numbers.Integral) or self.step < 0:
            raise ValueError(f"step must be an int >= 0, got {self.step!r}")
        object.__setattr__(self, "step", int(self.step))
        if not isinstance(self.cost, (ZCDP, ApproxDP)):
            raise TypeError(f"cost must be ZCDP or ApproxDP, got {type(self.cost).__name__}")
        if self.timestamp is not None:
            object.__setattr__(self, "timestamp", _check_real(self.timestamp, "timestamp"))

    def get_state(self) -> dict[str, Any]:
        c = self.cost
        cost = ({"kind": "zcdp", "rho": c.rho} if isinstance(c, ZCDP)
                else {"kind": "approx_dp", "epsilon": c.epsilon, "delta": c.delta})
        return {"release": self.release, "step": self.step, "cost": cost, "timestamp": self.timestamp}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "LedgerEntry":
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

    def __init__(self, budget: PrivacyBudget, plan: BudgetPlan | None = None,
                 entries: Iterable[LedgerEntry] = ()):
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
    def record(self, release: str, step: int, cost: Cost, timestamp: float | None = None) -> LedgerEntry:
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
        if self._allot is not None:
            if entry.release not in self._allot:
                raise BudgetKindError(f"{who}: release {entry.release!r} is not in the plan")
            limit = self._allot[entry.release]
            if type(limit) is not type(c):
                raise BudgetKindError(f"{who} spends {type(c).__name__} but its plan allots {type(limit).__name__}")
        if isinstance(c, ZCDP):
            new_total = self._rho + c.rho
            if _exceeds(new_total, self.budget.rho):
                raise BudgetExhaustedError(f"{who} would spend rho={c.rho:.6g}: total {new_total:.12g} "
                                           f"> budget rho={self.budget.rho:.12g}", entry.release, entry.step)
            if self._allot is not None and _exceeds(mine[0] + c.rho, limit.rho):
                raise BudgetExhaustedError(f"{who} would spend rho={c.rho:.6g}: release total "
                                           f"{mine[0] + c.rho:.12g} > its allotment rho={limit.rho:.12g}",
                                           entry.release, entry.step)
            self._rho = new_total
            mine = [mine[0] + c.rho, mine[1], mine[2]]
        else:
            new_eps, new_delta = self._eps + c.epsilon, self._delta + c.delta
            if _exceeds(new_eps, self.budget.epsilon) or _exceeds(new_delta, self.budget.delta):
                raise BudgetExhaustedError(
                    f"{who} would spend (epsilon, delta)=({c.epsilon:.6g}, {c.delta:.6g}): total "
                    f"({new_eps:.12g}, {new_delta:.12g}) > budget ({self.budget.epsilon:.12g}, "
                    f"{self.budget.delta:.12g})", entry.release, entry.step)
            if self._allot is not None and (_exceeds(mine[1] + c.epsilon, limit.epsilon)
                                            or _exceeds(mine[2] + c.delta, limit.delta)):
                raise BudgetExhaustedError(
                    f"{who} would spend (epsilon, delta)=({c.epsilon:.6g}, {c.delta:.6g}): release total "
                    f"({mine[1] + c.epsilon:.12g}, {mine[2] + c.delta:.12g}) > its allotment "
                    f"({limit.epsilon:.12g}, {limit.delta:.12g})", entry.release, entry.step)
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
        delta = _check_real(delta, "delta", high=1.0)
        mon = self.spent_approx_dp()
        delta_z = delta - mon.delta
        if delta_z < 0.0 or (delta_z == 0.0 and self._rho > 0.0):
            raise ValueError(f"delta={delta:.6g} leaves nothing for the zCDP part: the monitors "
                             f"already used delta={mon.delta:.6g}")
        return zcdp_to_approx_dp(self._rho, delta_z) + mon.epsilon

    def total_approx_dp(self, delta: float) -> ApproxDP:
        """The whole spend as an :class:`ApproxDP` at total ``delta`` (see :meth:`total_epsilon`)."""
        return ApproxDP(self.total_epsilon(delta), delta)

    # -- state ------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Budget, optional plan and entries; serialisable with :mod:`pipeline.serialization`."""
        plan = None
        if self.plan is not None:
            plan = [{"name": r.name, "share": r.share, "kind": r.kind,
                     "cost": None if r.cost is None else LedgerEntry(r.name, 0, r.cost).get_state()["cost"]}
                    for r in self.plan.releases]
        return {"budget": self.budget.get_state(), "plan": plan,
                "entries": [e.get_state() for e in self._entries]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "PrivacyLedger":
        budget = PrivacyBudget.from_state(state["budget"])
        plan = None
        if state.get("plan") is not None:
            releases = []
            for r in state["plan"]:
                cost = None
                if r["cost"] is not None:
                    cost = LedgerEntry.from_state({"release": r["name"], "step": 0, "cost": r["cost"],
                                                   "timestamp": None}).cost
                releases.append(PlannedRelease(r["name"], cost=cost, share=r["share"], kind=r["kind"]))
            plan = BudgetPlan(budget, releases)
        return cls(budget, plan, [LedgerEntry.from_state(e) for e in state["entries"]])
