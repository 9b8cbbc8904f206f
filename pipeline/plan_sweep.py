"""``dpstream plan --sweep`` and ``--target``: the a-priori bounds of a deployment over several
values of one configuration key, and the smallest budget at which a named release's bound is
within a stated share of n.

Every point is the configuration file with one key replaced, validated and planned exactly as
``dpstream plan`` would (``parse_config`` and the budget plan): nothing is drawn and nothing runs. A
value the configuration refuses (e.g. a budget above the ceiling) is a row that says why.

``--target`` bisects on the logarithm of the key's value. It relies on the bound being monotone in
the budget: every release's noise scale decreases as its allotment grows, and its bound is a tail
quantile of that noise. The search keeps the invariant "hi meets the share, lo does not" and stops
when hi/lo ≤ 1 + 10⁻³; it reports hi, a value that meets the share, with its bound.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from pipeline.config import ConfigError, Deployment, parse_config
from pipeline.error_bounds import planned_spend, release_bounds
from pipeline.privacy.errors import PrivacyBudgetError

__all__ = [
    "SweepPoint",
    "parse_sweep",
    "sweep",
    "format_sweep",
    "find_target",
    "format_target",
    "TargetResult",
]

_RELATIVE_PRECISION = 1e-3
_MAX_STEPS = 200


@dataclass(frozen=True)
class SweepPoint:
    """One value of the swept key: each release's largest bound as a share of n, or why refused."""

    value: float
    shares: dict[str, float]  # release -> its largest a-priori bound / n
    bounds: dict[str, float]  # release -> that bound in users
    total_epsilon: float
    total_delta: float
    refused: str | None = None


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """``KEY=V1,V2,...`` → (key, values); values must be positive numbers."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ValueError(f"--sweep must look like budget.rho=0.005,0.01,0.02, got {text!r}")
    try:
        nums = [float(v) for v in values.split(",")]
    except ValueError:
        raise ValueError(
            f"--sweep values must be numbers separated by commas, got {values!r}"
        ) from None
    if any(not (v > 0) or not math.isfinite(v) for v in nums):
        raise ValueError(f"--sweep values must be positive and finite, got {values!r}")
    return key.strip(), nums


def _with_value(data: dict, key: str, value: float) -> dict:
    out = copy.deepcopy(data)
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            raise ValueError(
                f"--sweep/--vary key {key!r}: {part!r} is not a section of the configuration"
            )
        node = node[part]
    node[parts[-1]] = value
    return out


def evaluate(data: dict, key: str, value: float, source: str = "<config>") -> SweepPoint:
    """The plan of the configuration ``data`` with ``key`` set to ``value``."""
    try:
        deployment: Deployment = parse_config(_with_value(data, key, value), source=source)
        allot = deployment.budget_plan().allotments()
    except (ConfigError, PrivacyBudgetError) as err:
        return SweepPoint(value, {}, {}, math.nan, math.nan, refused=str(err))
    bounds = release_bounds(deployment, allot, deployment.n)
    largest = {name: b.bounds[b.largest] for name, b in bounds.items()}
    total = planned_spend(deployment, allot)
    shares = {k: v / deployment.n for k, v in largest.items()}
    return SweepPoint(value, shares, largest, total.epsilon, total.delta)


def sweep(data: dict, key: str, values: list[float], source: str = "<config>") -> list[SweepPoint]:
    return [evaluate(data, key, v, source) for v in values]


def format_sweep(key: str, points: list[SweepPoint], n: int) -> str:
    """The sweep as a table, then one sentence per release saying how its bound moves."""
    names = sorted({name for p in points for name in p.shares})
    head = [key] + [f"{name} (bound, share of n)" for name in names] + ["total (ε, δ)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        if p.refused:
            lines.append(f"| {p.value:g} | refused: {p.refused} |")
            continue
        cells = [f"{p.value:g}"]
        cells += [f"{p.bounds[name]:,.1f} ({p.shares[name]:.2%})" for name in names]
        cells.append(f"({p.total_epsilon:.4g}, {p.total_delta:.2g})")
        lines.append("| " + " | ".join(cells) + " |")
    ok = [p for p in points if not p.refused]
    lines.append("")
    lines.append(
        f"Each row plans the deployment (n = {n:,}) with {key} set to the row's value; "
        "a bound is the release's largest a-priori error (it holds with probability "
        "≥ 1 − β), in users and as a share of n. Nothing is drawn."
    )
    if len(ok) >= 2:
        first, last = ok[0], ok[-1]
        for name in names:
            ratio = last.bounds[name] / first.bounds[name] if first.bounds[name] else math.nan
            lines.append(
                f"In words: {name}'s bound goes from {first.bounds[name]:,.1f} users "
                f"({first.shares[name]:.2%} of n) at {key} = {first.value:g} to "
                f"{last.bounds[name]:,.1f} ({last.shares[name]:.2%}) at {last.value:g}: "
                f"×{ratio:.3g} when {key} is ×{last.value / first.value:.3g}."
            )
    return "\n".join(lines)


@dataclass(frozen=True)
class TargetResult:
    release: str
    share: float
    key: str
    value: float | None  # smallest value found meeting the share (None: not within range)
    point: SweepPoint | None
    low: float
    high: float
    steps: int


def _meets(point: SweepPoint, release: str, share: float) -> bool:
    return point.refused is None and point.shares[release] <= share


def _log_bisect(evaluate_at, lo: float, hi: float, good, good_high: bool):
    """Bisect [lo, hi] on log(value) until hi/lo ≤ 1 + 10⁻³ for the boundary of the monotone
    predicate ``good`` (true at hi if ``good_high``, else at lo). Returns (lo, hi, the last point
    evaluated on the good side or None, evaluations)."""
    kept, steps = None, 0
    while hi / lo > 1.0 + _RELATIVE_PRECISION and steps < _MAX_STEPS:
        mid = math.sqrt(lo * hi)
        point = evaluate_at(mid)
        steps += 1
        if good(point) == good_high:
            hi = mid
        else:
            lo = mid
        if good(point):
            kept = point
    return lo, hi, kept, steps


def find_target(
    data: dict,
    key: str,
    release: str,
    share: float,
    low: float,
    high: float,
    source: str = "<config>",
) -> TargetResult:
    """Smallest value of ``key`` in [low, high] (to a relative 10⁻³) at which ``release``'s largest
    bound is ≤ ``share``·n, by bisection on log(value). If the configuration refuses ``high`` (e.g.
    above the budget ceiling) the search first finds the largest accepted value, refusal being
    monotone in the budget too."""
    if not (0 < share < 1):
        raise ValueError(f"--target share must be in (0, 1), got {share!r}")
    if not (0 < low < high) or not math.isfinite(high):
        raise ValueError(
            f"--within must be two positive numbers LOW,HIGH with LOW < HIGH, got {low!r},{high!r}"
        )

    def at(value: float) -> SweepPoint:
        return evaluate(data, key, value, source)

    top, bottom, steps = at(high), at(low), 2
    if bottom.refused is not None:
        return TargetResult(release, share, key, None, bottom, low, high, steps)
    if top.refused is not None:
        accepted = lambda p: p.refused is None  # noqa: E731
        high, _, kept, more = _log_bisect(at, low, high, accepted, good_high=False)
        top, steps = kept or bottom, steps + more
    if release not in top.shares:
        names = ", ".join(sorted(top.shares))
        raise ValueError(f"--target: no release named {release!r} (releases: {names})")
    if not _meets(top, release, share):
        return TargetResult(release, share, key, None, top, low, high, steps)
    if _meets(bottom, release, share):
        return TargetResult(release, share, key, low, bottom, low, high, steps)
    meets = lambda p: _meets(p, release, share)  # noqa: E731
    _, value, kept, more = _log_bisect(at, low, high, meets, good_high=True)
    return TargetResult(release, share, key, value, kept or top, low, high, steps + more)


def format_target(result: TargetResult, n: int) -> str:
    r = result
    if r.value is None:
        why = (
            f" ({r.point.refused})"
            if r.point and r.point.refused
            else (f": its bound is {r.point.shares[r.release]:.2%} of n there" if r.point else "")
        )
        return (
            f"{r.release}: no {r.key} up to {r.high:.4g} (the largest accepted in the range) "
            f"brings its bound within {r.share:.2%} of n "
            f"(n = {n:,}){why}. Raise --within's upper end, or accept a larger share."
        )
    p = r.point
    assert p is not None  # a value is found at a plan point
    return (
        f"{r.release}: the smallest {r.key} at which its a-priori bound is within "
        f"{r.share:.2%} of n (n = {n:,}) is {r.value:.4g} (searched {r.low:g}..{r.high:g}, "
        f"{r.steps} plans, to a relative {_RELATIVE_PRECISION:g}): bound "
        f"{p.bounds[r.release]:,.1f} users = {p.shares[r.release]:.2%} of n; the whole "
        f"deployment then plans (ε, δ) = ({p.total_epsilon:.4g}, {p.total_delta:.2g})."
    )
