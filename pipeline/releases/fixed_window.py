"""Fixed-window synthetic data (Bun, Gaboardi, Neunhoeffer, Zhang, "Continual release of differentially
private synthetic data from longitudinal data collections", arXiv 2306.07884, Alg. 1).

Privacy: at each update step t = k..T the histogram of the users' last-k patterns gets discrete
Gaussian noise of variance σ² per bin; one user's pattern sits in one bin, so the L2 sensitivity is
Δ² = 1 (add/remove) or 2 (replace) and the step is Δ²/(2σ²)-zCDP (Canonne, Kamath, Steinke, "The
discrete Gaussian for differential privacy", NeurIPS 2020, Theorem 14). The synthesizer sets
σ² = Δ²·R/(2ρ) with R = T − k + 1, so the R events add up to the release's ρ. Nothing is spent
before step k.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from pipeline.privacy.accounting import ZCDP

from .aggregators import FixedWindowAggregator
from .base import ReleaseConfig, ReleaseKind, Setting, StepInput, StepOutput, register
from .bounds import ReleaseBounds

__all__ = ["FixedWindowRelease", "FixedWindowKind"]

MAX_BINS = 2**22  # attribute size ** window: the histogram the synthesizer holds per step


class FixedWindowRelease(ReleaseConfig):
    type: Literal["fixed_window"]
    window: int = Field(ge=1)
    beta: float = Field(default=0.05, gt=0, lt=1)


@register
class FixedWindowKind(ReleaseKind):
    name = "fixed_window"
    config = FixedWindowRelease
    budget = "zcdp"
    synthetic = True

    def check(self, release, attribute, horizon):
        if release.window > horizon:
            raise ValueError(f"window: {release.window} exceeds horizon {horizon}")
        if attribute.type == "hashed":
            raise ValueError("attribute: fixed-window releases need a binary or categorical attribute")
        if attribute.size ** release.window > MAX_BINS:
            raise ValueError(f"window: {attribute.size}^{release.window} histogram bins is too many")

    def aggregator(self, release, attribute, rows, horizon):
        return FixedWindowAggregator(rows, release.window, attribute.size)

    def build(self, release, setting: Setting):
        from pipeline.synth.fixed_window import FixedWindowSynthesizer

        return FixedWindowSynthesizer(setting.horizon, release.window, setting.allotment.rho, beta=release.beta,
                                      categories=setting.domain_size, neighbours=setting.neighbours,
                                      seed=setting.seed, n=setting.n)

    def events(self, release, mechanism, setting):
        """Δ²/(2σ²) at each update step t ≥ k, from the σ² the synthesizer samples with."""
        per_step = ZCDP(mechanism.sensitivity_factor / (2.0 * mechanism.sigma2))
        return tuple(per_step if t >= mechanism.window else None for t in range(1, setting.horizon + 1))

    def bounds(self, release, mechanism, horizon):
        mech, bins = mechanism, mechanism.n_bins
        return ReleaseBounds(release.name, release.type, mech.beta,
                             {"lambda": mech.accuracy_bound, "sigma2": mech.sigma2,
                              "padding_records": mech.n_pad * bins},
                             "lambda", padding=mech.n_pad, meaning="window counts",
                             notes=[f"{mech.n_pad} padding records for each of the {bins} length-{mech.window} patterns "
                                    f"(m ≈ n + {mech.n_pad * bins}); subtract n_pad to debias a count"])

    def release_step(self, s: StepInput) -> StepOutput:
        mech, rel, manifest = s.mechanism, s.release, s.manifest
        manifest["parameters"] = mech.parameters()
        if s.step < rel.window:
            manifest["status"] = f"accumulating: the first window is complete at step {rel.window}"
            return StepOutput()
        counts = np.sum([p["counts"] for p in s.parts], axis=0)
        columns = mech.release_counts(counts)
        manifest["parameters"] = mech.parameters()  # m is known from step k on
        manifest["noisy_counts"] = mech.noisy_counts[s.step].tolist()
        manifest["projected_counts"] = mech.projected_counts[s.step].tolist()
        manifest["clamped_bins"] = int(mech.clamped_bins[s.step])
        column_steps = list(range(1, rel.window + 1)) if s.step == rel.window else [s.step]
        return StepOutput(columns=columns, column_steps=column_steps)
