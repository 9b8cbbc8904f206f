"""``dpstream plan``: per release, its allotment, padding, error bounds and spending schedule, the
whole planned spend as (ε, δ), and a warning for a bound above the population — before anything runs.
The numbers come from :mod:`pipeline.error_bounds` (the mechanisms themselves) and :mod:`pipeline.plan`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config import EPSILON_CEILING
from pipeline.error_bounds import planned_spend, release_bounds, warnings
from pipeline.plan import planned_schedule
from pipeline.privacy.events import ZCDP
from pipeline.releases import kind_of
from pipeline.upload_time import deadline_warning

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["plan_report", "format_plan", "deployment_warnings"]

_LABEL = {"lambda": "λ", "error": "error bound", "tau": "τ", "margin": "margin", "alpha": "α"}


def _schedule_text(values: list[float], unit: str) -> str:
    """The per-step charges in one line: a constant run by its steps, a long varying one by its range."""
    steps = [t for t, x in enumerate(values, start=1) if x > 0]
    if not steps:
        return "nothing"
    first, last = steps[0], steps[-1]
    where = f"step {first}" if first == last else f"steps {first}..{last}"
    charged = [values[t - 1] for t in steps]
    if max(charged) == min(charged):
        return f"{unit} = {charged[0]:.6g} at {'each of ' if len(steps) > 1 else ''}{where}"
    if len(steps) <= 24:
        return f"{unit} at {where}: " + ", ".join(f"{x:.3g}" for x in charged)
    return f"{unit} at {where}, between {min(charged):.3g} and {max(charged):.3g} per step"


def plan_report(deployment: Deployment) -> dict[str, Any]:
    """Everything ``dpstream plan`` shows, as JSON-ready data (raises BudgetExceededError like the plan)."""
    allot = deployment.budget_plan().allotments()
    n = deployment.n
    bounds = release_bounds(deployment, allot, n)
    schedule = planned_schedule(deployment)
    total = planned_spend(deployment, allot)
    releases = {}
    for rel in deployment.releases:
        cost = allot[rel.name]
        releases[rel.name] = {
            "allotment": {"rho": cost.rho}
            if isinstance(cost, ZCDP)
            else {"epsilon": cost.epsilon, "delta": cost.delta},
            **bounds[rel.name].as_json(),
            "notes": bounds[rel.name].notes,
            "bound_source": kind_of(rel).bound_source,
            "as_share_of_n": bounds[rel.name].bounds[bounds[rel.name].largest] / n,
            "in_words": kind_of(rel).explain(bounds[rel.name], n),
            "schedule": schedule[rel.name].tolist(),
        }
    return {
        "deployment": deployment.name,
        "n": n,
        "horizon": deployment.horizon,
        "neighbours": str(deployment.neighbours),
        "releases": releases,
        "total_as_approx_dp": {
            "epsilon": total.epsilon,
            "delta": total.delta,
            "rho": deployment.budget_plan().totals()[0].rho,
            "report_delta": deployment.budget.report_delta,
            "ceiling": EPSILON_CEILING,
            "allow_large": deployment.budget.allow_large,
        },
        "warnings": deployment_warnings(deployment)
        + warnings(bounds, n)
        + [w for w in [deadline_warning(deployment)] if w],
    }


def deployment_warnings(deployment: Deployment) -> list[str]:
    """Warnings about the deployment itself rather than a release's accuracy."""
    steps = deployment.steps
    if deployment.production and steps.close == "deadline" and not steps.publish_delay_seconds:
        return [
            "production deployment closing on a deadline without steps.publish_delay_seconds: "
            "when a step's records appear then depends on how long its release took, which "
            "depends on the data; set it above the worst release time (docs/privacy.md, "
            "'When records appear')"
        ]
    return []


def format_plan(report: dict[str, Any]) -> str:
    """The report as text for the operator's terminal (warnings are printed separately)."""
    lines = [
        f"deployment {report['deployment']}: n = {report['n']:,} users, horizon T = {report['horizon']} steps, "
        f"neighbouring relation {report['neighbours']}"
    ]
    for name, r in report["releases"].items():
        spend = ", ".join(f"{k} = {v:.6g}" for k, v in r["allotment"].items())
        lines.append(
            f"\n{name} ({r['type']}): allotment {spend}; bounds hold with probability ≥ 1 − β, β = {r['beta']:g}"
        )
        bound = r["compared_with_n"]
        lines.append(
            f"  {_LABEL.get(bound, bound)} = {r['bounds'][bound]:,.2f} users ({r['as_share_of_n']:.2%} of n): "
            f"{r['bound_source']}"
        )
        lines.append(f"  in words: {r['in_words']}")
        lines += [f"  {note}" for note in r["notes"]]
        lines.append(
            f"  charged: {_schedule_text(r['schedule'], 'ρ' if 'rho' in r['allotment'] else 'ε')}"
        )
    t = report["total_as_approx_dp"]
    how = (
        f" (ρ = {t['rho']:.6g} converted at report_delta = {t['report_delta']:.3g}, plus the monitors' (ε, δ))"
        if t["rho"]
        else " (the monitors' (ε, δ) by basic composition)"
    )
    lines.append(
        f"\ntotal planned spend over the horizon: (ε, δ) = ({t['epsilon']:.6g}, {t['delta']:.3g}){how}"
    )
    if t.get("allow_large"):
        lines.append(
            f"budget.allow_large: true — a total ε above the ceiling {t['ceiling']:g} is accepted "
            f"({'it is' if t['epsilon'] > t['ceiling'] else 'it is not'} above it)"
        )
    return "\n".join(lines)
