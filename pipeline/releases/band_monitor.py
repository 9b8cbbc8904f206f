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

from typing import Literal

from pydantic import Field, model_validator

from .aggregators import ActiveSetAggregator
from .base import ReleaseConfig, ReleaseKind, Setting, StepInput, StepOutput, charged_at_step_one, register
from .bounds import BAND_BETA, ReleaseBounds

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
    def _band(self) -> "BandMonitorRelease":
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


@register
class BandMonitorKind(ReleaseKind):
    name = "band_monitor"
    config = BandMonitorRelease
    budget = "approx_dp"

    def check(self, release, attribute, horizon):
        if not attribute.is_label(release.value):
            raise ValueError(f"value: {release.value!r} is not in the domain of {release.attribute!r}")

    def needs_feedback(self, release):
        return True

    def aggregator(self, release, attribute, rows, horizon):
        # a user leaves after one Above/Below it contributed to
        return ActiveSetAggregator(rows, 1, counted=True, watch_value=attribute.code(release.value))

    def build(self, release, setting: Setting):
        from pipeline.monitors import BandMonitor

        return BandMonitor.from_target(0, setting.allotment.epsilon, setting.allotment.delta,
                                       neighbours=setting.neighbours, seed=setting.seed)

    def events(self, release, mechanism, setting):
        from pipeline.monitors.calibration import outside_interval_privacy

        target = setting.allotment
        guarantee = outside_interval_privacy(mechanism.a, target.delta, setting.neighbours).as_approx_dp()
        return charged_at_step_one(target, guarantee, setting.horizon, f"release {release.name!r}")

    def bounds(self, release, mechanism, horizon):
        margin = mechanism.utility_margin(horizon, BAND_BETA)
        return ReleaseBounds(release.name, release.type, BAND_BETA, {"margin": margin, "noise_a": mechanism.a},
                             "margin", meaning="band answers",
                             notes=[f"answers are reliable outside ({release.low:g} ± {margin}, "
                                    f"{release.high:g} ± {margin})"])

    def release_step(self, s: StepInput) -> StepOutput:
        rel, mech = s.release, s.mechanism
        count = sum(int(p["count"]) for p in s.parts)
        answer = mech.release_count(count, rel.low, rel.high)
        s.manifest["parameters"] = {"mechanism": "band_monitor", "value": rel.value, "low": rel.low,
                                    "high": rel.high, "noise_a": mech.a, "neighbours": s.neighbours}
        alerts = {"release": rel.name, "step": s.step, "type": "band", "attribute": rel.attribute,
                  "value": rel.value, "low": rel.low, "high": rel.high, "answer": answer}
        # after Above/Below, the users holding the value leave the active set (Ghazi et al., PREM, Alg. 1).
        # Always sent (possibly empty): workers hold step t+1's close until every charging
        # release's feedback of step t has arrived.
        watched = s.attribute.code(rel.value)
        return StepOutput(alerts=alerts, feedback={"flagged": [watched] if answer != "between" else []})
