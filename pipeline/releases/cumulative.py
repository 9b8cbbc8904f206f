"""Cumulative synthetic data over a binary attribute (Bun, Gaboardi, Neunhoeffer, Zhang, "Continual
release of differentially private synthetic data from longitudinal data collections", arXiv
2306.07884, Alg. 2).

Privacy: counter b (b = 1..T) counts the users whose weight goes from b − 1 to b; one user moves
at most once per counter, so each counter is a continual counter of sensitivity 1 per step. Its
budget ρ_b (weights ``pipeline.synth.cumulative.counter_weights``) is fixed when it starts at step b,
and its whole cost is charged then, as the ρ implied by the σ² its draws use (the tree counter's
Δ² = L or 2L, the square-root factorization's Δ² of its integer coefficients:
``counter.realised_rho``). The T events add up to the release's ρ.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from pipeline.privacy.accounting import ZCDP

from .aggregators import CumulativeAggregator
from .base import ReleaseConfig, ReleaseKind, Setting, StepInput, StepOutput, register
from .bounds import ReleaseBounds

__all__ = ["CumulativeRelease", "CumulativeKind"]


class CumulativeRelease(ReleaseConfig):
    type: Literal["cumulative"]
    beta: float = Field(default=0.05, gt=0, lt=1)
    counter: Literal["tree", "factorization"] = Field(
        default="factorization",
        description="continual counter behind each cumulative count: the square-root factorization "
                    "(lower error, docs/synthesizers.md) or the binary tree of the paper")


@register
class CumulativeKind(ReleaseKind):
    name = "cumulative"
    config = CumulativeRelease
    budget = "zcdp"
    synthetic = True

    def check(self, release, attribute, horizon):
        if attribute.type != "binary":
            raise ValueError("attribute: cumulative releases need a binary attribute")

    def aggregator(self, release, attribute, rows, horizon):
        return CumulativeAggregator(rows, horizon)

    def build(self, release, setting: Setting):
        from pipeline.synth.cumulative import CumulativeSynthesizer

        return CumulativeSynthesizer(setting.horizon, setting.allotment.rho, beta=release.beta,
                                     neighbours=setting.neighbours, seed=setting.seed, n=setting.n,
                                     counter=release.counter)

    def events(self, release, mechanism, setting):
        """Counter b's realised ρ at step b (when it starts)."""
        return tuple(ZCDP(c.realised_rho) for c in mechanism.counters)

    def bounds(self, release, mechanism, horizon):
        return ReleaseBounds(release.name, release.type, mechanism.beta, {"error": mechanism.error_bound()}, "error",
                             meaning="cumulative counts", notes=[f"{mechanism.counter} counters; m = n records, no padding"])

    def release_step(self, s: StepInput) -> StepOutput:
        mech, manifest = s.mechanism, s.manifest
        z = np.sum([p["z"] for p in s.parts], axis=0)
        columns = mech.release_counts(z)
        manifest["parameters"] = mech.parameters()
        manifest["noisy_counts"] = mech.noisy_counts[s.step].tolist()
        manifest["monotone_counts"] = mech.monotone_counts[s.step].tolist()
        return StepOutput(columns=columns, column_steps=[s.step])
