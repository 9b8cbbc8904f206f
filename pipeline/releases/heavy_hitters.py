"""Shifting heavy hitters (Kaplan, Mansour, Stemmer, "The sparse vector technique, revisited",
arXiv 2011.07637, §4), with the methods of ``pipeline.monitors.heavy_hitters``.

Privacy: the mechanism calibrates its noise to the release's whole (ε, δ) over the horizon (the
method's theorem: Theorem 3.2/4.4 for ``tme``, Cohen and Lyu's Theorem B.4 for ``tct``, ...); that
guarantee does not decompose per step, so all of it is charged at step 1. The mechanism's
``privacy`` is the guarantee its derived noise scales give; it is checked to be within the charge.
With ``tme``/``tct`` a user is charged each time an element it holds is flagged: the releaser sends
the flags back and the workers retire a user after k charges (needs feedback).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from pipeline.attributes import Attribute
from pipeline.privacy.events import ApproxDP

from .aggregators import ActiveSetAggregator, Aggregator
from .base import (
    AlertsKind,
    PrivacyEvent,
    ReleaseConfig,
    Setting,
    StepInput,
    StepOutput,
    charged_at_step_one,
    register,
)
from .bounds import ReleaseBounds
from .histograms import merge_histograms
from .reading import Context

__all__ = ["HeavyHittersRelease", "HeavyHittersKind"]

CHARGING_METHODS = ("tme", "tct")  # methods that retire users after k charges


class HeavyHittersRelease(ReleaseConfig):
    type: Literal["heavy_hitters"]
    method: Literal["tme", "tct", "svt_restart", "naive"] = "tct"
    k: int = Field(
        default=3, ge=1, description="times one user may contribute to a flagged element"
    )
    beta: float = Field(default=0.05, gt=0, lt=1)


@register
class HeavyHittersKind(AlertsKind[HeavyHittersRelease]):
    name = "heavy_hitters"
    config = HeavyHittersRelease
    budget = "approx_dp"

    def needs_feedback(self, release: HeavyHittersRelease) -> bool:
        return release.method in CHARGING_METHODS

    def aggregator(
        self, release: HeavyHittersRelease, attribute: Attribute, rows: int, horizon: int
    ) -> Aggregator:
        return ActiveSetAggregator(rows, release.k, counted=self.needs_feedback(release))

    def build(self, release: HeavyHittersRelease, setting: Setting) -> Any:
        from pipeline.monitors import ShiftingHeavyHitters

        return ShiftingHeavyHitters(
            setting.domain_size,
            setting.approx_dp.epsilon,
            setting.approx_dp.delta,
            release.k,
            setting.horizon,
            beta=release.beta,
            method=release.method,
            seed=setting.seed,
            neighbours=setting.neighbours,
        )

    def events(
        self, release: HeavyHittersRelease, mechanism: Any, setting: Setting
    ) -> tuple[PrivacyEvent | None, ...]:
        target = ApproxDP(mechanism.epsilon, mechanism.delta)
        return charged_at_step_one(
            target, mechanism.privacy, setting.horizon, f"release {release.name!r}"
        )

    def bounds(self, release: HeavyHittersRelease, mechanism: Any, horizon: int) -> ReleaseBounds:
        mech = mechanism
        return ReleaseBounds(
            release.name,
            release.type,
            mech.beta,
            {"tau": mech.tau, "threshold": mech.threshold},
            "tau",
            meaning="heavy-hitter guarantee",
            notes=[f"method {mech.method}; a user is charged for at most k = {mech.k} flags"],
        )

    # -- reading side ---------------------------------------------------------------------------
    bound_source = (
        "every element held by ≥ τ active users is flagged and none held by nobody, at every step "
        "(Kaplan–Mansour–Stemmer, arXiv 2011.07637, Def. 4.1; the project's calibration)"
    )

    output = "alerts"

    def questions(
        self, release: HeavyHittersRelease, unit: str = "step"
    ) -> tuple[list[str], list[str]]:
        return (
            [
                "which values are held by many active users at step t: every value held by at least τ active users "
                "is flagged, and no value held by nobody, at every step (with probability ≥ 1 − β)"
            ],
            [
                "how many users hold a value (a flag is not a count)",
                "values held by fewer than τ users",
                f"values whose users have spent their k = {release.k} flags"
                if release.method in CHARGING_METHODS
                else "nothing else",
            ],
        )

    def explain(self, bounds: ReleaseBounds, n: int) -> str:
        from .reading import confidence, points

        tau = bounds.bounds["tau"]
        return (
            f"with probability {confidence(bounds.beta)}, every value held by at least τ = {tau:,.0f} active users "
            f"({points(tau, n)} of n = {n:,}) is flagged, and no value held by nobody is, at every step"
        )

    def flag_limit(self, release: HeavyHittersRelease) -> str:
        """Why a flagged value stops being flagged, in words."""
        if release.method not in CHARGING_METHODS:
            return "flags do not run out with this method (the noise is calibrated to every step instead)"
        return (
            f"each time a value is flagged, every user holding it spends one of their k = {release.k} flags; a "
            f"user who has spent k no longer counts towards any value (that is what bounds the privacy cost), so "
            f"a value held by the same users is flagged at most {release.k} times and then silently drops out "
            "even if it is still common"
            + (
                "; a noisy count is of the active holders only (those with flags left), so a count that falls "
                "after flags ran out is not a falling popularity"
                if release.method == "tct"
                else ""
            )
        )

    def alert_text(self, release: HeavyHittersRelease, alert: dict[str, Any], ctx: Context) -> str:
        from .reading import code_labels

        flagged = [int(x) for x in alert.get("flagged", [])]
        if not flagged:
            return "no value flagged"
        names = code_labels(ctx.attribute, flagged)
        counts = alert.get("noisy_counts")
        if counts and len(counts) == len(flagged):
            names = [f"{name} (noisy count {c:,.0f})" for name, c in zip(names, counts)]
        times = alert.get("times_flagged") or []
        if release.method in CHARGING_METHODS and len(times) == len(flagged):
            names = [f"{name}, {_flag_number(t, release.k)}" for name, t in zip(names, times)]
        return "flagged: " + "; ".join(names)

    def observe(self, manifest: dict[str, Any], alerts: dict[str, Any] | None) -> dict[str, float]:
        return {"heavy_hitters": float(len((alerts or {}).get("flagged", [])))}

    def release_step(self, s: StepInput) -> StepOutput:
        """Sum the partitions' active-user histograms, flag; alerts name ids through the public domain."""
        rel, mech, attr = s.release, s.mechanism, s.attribute
        support, summed = merge_histograms(s.parts, attr.size)
        flagged = mech.release_histogram(support, summed)
        s.manifest["parameters"] = {
            "mechanism": "shifting_heavy_hitters",
            "method": rel.method,
            "domain_size": attr.size,
            "k": rel.k,
            "threshold": mech.threshold,
            "tau": mech.tau,
            "beta": rel.beta,
            "neighbours": s.neighbours,
        }
        s.manifest["flagged"] = len(flagged)
        alerts = {
            "release": rel.name,
            "step": s.step,
            "type": "heavy_hitters",
            "method": rel.method,
            "flagged": flagged.tolist(),
            "threshold": mech.threshold,
            "tau": mech.tau,
            "labels": attr.public_labels(flagged),
        }
        if rel.method == "tct":  # individual-charging SVT publishes the noisy count of each hit
            alerts["noisy_counts"] = np.asarray(mech.noisy_counts).tolist()
        feedback = {"flagged": flagged.tolist()} if self.needs_feedback(rel) else None
        return StepOutput(alerts=alerts, feedback=feedback)


def _flag_number(times: int, k: int) -> str:
    """The how-many-th flag of a value, read against the per-user charge limit k."""
    if times < k:
        return f"flag {times} of k = {k}"
    if times == k:
        return (
            f"flag {times} of k = {k}: its users' flags are now spent, it will not be flagged again for them "
            "(a later noisy count of it counts only other users)"
        )
    return (
        f"flagged {times} times (more than k = {k}: users with flags left hold it now, not only the users "
        "flagged before)"
    )
