"""Band monitor: alert when the number of active users holding a value leaves [low, high]
(Ghazi et al., PREM, arXiv 2502.14809, Alg. 1, with the active set over users).

Privacy: the count gets discrete Laplace noise of parameter a, calibrated
(``calibration.calibrate_outside_interval``) so that target charging (Cohen and Lyu, Theorem B.4:
one hit per user, two under replace) gives the release's (ε, δ) over the whole horizon; all of it is
charged at step 1. The guarantee of the built monitor's a is recomputed and checked within the charge.
After an Above/Below answer the users holding the value leave the active set: the releaser sends
the watched code back and the workers retire them (needs feedback).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.attributes import Attribute

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
from .bounds import BAND_BETA, ReleaseBounds
from .reading import Context

__all__ = ["BandMonitorRelease", "BandMonitorKind"]


class BandMonitorRelease(ReleaseConfig):
    """Alert when the number of (active) users holding ``value`` leaves [low, high] (counts of users).

    A user leaves the active set after contributing to one Above/Below answer (Ghazi et al., PREM, Alg. 1);
    that single charge per user is what the calibration assumes.
    """

    type: Literal["band_monitor"]
    value: str = Field(description="the attribute value whose count is watched")
    low: float
    high: float

    @model_validator(mode="after")
    def _band(self) -> BandMonitorRelease:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


@register
class BandMonitorKind(AlertsKind[BandMonitorRelease]):
    name = "band_monitor"
    config = BandMonitorRelease
    budget = "approx_dp"

    def check(self, release: BandMonitorRelease, attribute: Attribute, horizon: int) -> None:
        if not attribute.is_label(release.value):
            raise ValueError(
                f"value: {release.value!r} is not in the domain of {release.attribute!r}"
            )

    def needs_feedback(self, release: BandMonitorRelease) -> bool:
        return True

    def aggregator(
        self, release: BandMonitorRelease, attribute: Attribute, rows: int, horizon: int
    ) -> Aggregator:
        # a user leaves after one Above/Below it contributed to
        return ActiveSetAggregator(rows, 1, counted=True, watch_value=attribute.code(release.value))

    def build(self, release: BandMonitorRelease, setting: Setting) -> Any:
        from pipeline.monitors import BandMonitor

        return BandMonitor.from_target(
            0,
            setting.approx_dp.epsilon,
            setting.approx_dp.delta,
            neighbours=setting.neighbours,
            seed=setting.seed,
        )

    def events(
        self, release: BandMonitorRelease, mechanism: Any, setting: Setting
    ) -> tuple[PrivacyEvent | None, ...]:
        from pipeline.monitors.calibration import outside_interval_privacy

        target = setting.approx_dp
        guarantee = outside_interval_privacy(
            mechanism.a, target.delta, setting.neighbours
        ).as_approx_dp()
        return charged_at_step_one(target, guarantee, setting.horizon, f"release {release.name!r}")

    def bounds(self, release: BandMonitorRelease, mechanism: Any, horizon: int) -> ReleaseBounds:
        margin = mechanism.utility_margin(horizon, BAND_BETA)
        return ReleaseBounds(
            release.name,
            release.type,
            BAND_BETA,
            {"margin": margin, "noise_a": mechanism.a},
            "margin",
            meaning="band answers",
            notes=[
                f"answers are reliable outside ({release.low:g} ± {margin}, "
                f"{release.high:g} ± {margin})"
            ],
        )

    # -- reading side ---------------------------------------------------------------------------
    bound_source = (
        "an answer can be wrong only for a true count within this of low or high, over the horizon "
        "(Ghazi et al., arXiv 2502.14809, Prop. 2.2 with discrete noise)"
    )

    output = "alerts"

    def questions(
        self, release: BandMonitorRelease, unit: str = "step"
    ) -> tuple[list[str], list[str]]:
        return (
            [
                f"whether the number of active users holding {release.value!r} is below {release.low:g}, between, "
                f"or above {release.high:g}, at every step"
            ],
            ["the count itself", "anything about a count within the margin of low or high"],
        )

    def explain(self, bounds: ReleaseBounds, n: int) -> str:
        from .reading import confidence, points

        margin = bounds.bounds["margin"]
        return (
            f"with probability {confidence(bounds.beta)}, an answer is wrong only when the true count is within "
            f"{margin:,.0f} users ({points(margin, n)} of n = {n:,}) of low or high, over the whole horizon"
        )

    def flag_limit(self, release: BandMonitorRelease) -> str:
        return (
            "after an above/below answer the users then holding the value leave the active set (each user "
            "contributes to one such answer: that is what the calibration charges), so later answers count only "
            "users who had not been part of one"
        )

    def alert_text(self, release: BandMonitorRelease, alert: dict[str, Any], ctx: Context) -> str:
        answer = str(alert.get("answer"))
        where = {"between": "within", "above": "above", "below": "below"}.get(answer, answer)
        return f"users holding {alert.get('value')!r}: {where} the band [{alert.get('low'):g}, {alert.get('high'):g}]"

    def release_step(self, s: StepInput) -> StepOutput:
        rel, mech = s.release, s.mechanism
        count = sum(int(p["count"]) for p in s.parts)
        answer = mech.release_count(count, rel.low, rel.high)
        s.manifest["parameters"] = {
            "mechanism": "band_monitor",
            "value": rel.value,
            "low": rel.low,
            "high": rel.high,
            "noise_a": mech.a,
            "neighbours": s.neighbours,
        }
        alerts = {
            "release": rel.name,
            "step": s.step,
            "type": "band",
            "attribute": rel.attribute,
            "value": rel.value,
            "low": rel.low,
            "high": rel.high,
            "answer": answer,
        }
        # after Above/Below, the users holding the value leave the active set (Ghazi et al., PREM, Alg. 1).
        # Always sent (possibly empty): workers hold step t+1's close until every charging
        # release's feedback of step t has arrived.
        watched = s.attribute.code(rel.value)
        return StepOutput(
            alerts=alerts, feedback={"flagged": [watched] if answer != "between" else []}
        )
