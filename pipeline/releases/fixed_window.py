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

from typing import Any, Literal

import numpy as np
from pydantic import Field

from pipeline.attributes import Attribute
from pipeline.privacy.events import ZCDP

from .aggregators import Aggregator, FixedWindowAggregator
from .base import CountsKind, PrivacyEvent, ReleaseConfig, Setting, StepInput, StepOutput, register
from .bounds import ReleaseBounds
from .reading import Answer, Context, Panel

__all__ = ["FixedWindowRelease", "FixedWindowKind"]

MAX_BINS = 2**22  # attribute size ** window: the histogram the synthesizer holds per step


class FixedWindowRelease(ReleaseConfig):
    type: Literal["fixed_window"]
    window: int = Field(ge=1)
    beta: float = Field(default=0.05, gt=0, lt=1)


@register
class FixedWindowKind(CountsKind[FixedWindowRelease]):
    name = "fixed_window"
    config = FixedWindowRelease
    budget = "zcdp"
    synthetic = True

    def check(self, release: FixedWindowRelease, attribute: Attribute, horizon: int) -> None:
        if release.window > horizon:
            raise ValueError(f"window: {release.window} exceeds horizon {horizon}")
        if attribute.type == "hashed":
            raise ValueError(
                "attribute: fixed-window releases need a binary or categorical attribute"
            )
        if attribute.size**release.window > MAX_BINS:
            raise ValueError(
                f"window: {attribute.size}^{release.window} histogram bins is too many"
            )

    def aggregator(
        self, release: FixedWindowRelease, attribute: Attribute, rows: int, horizon: int
    ) -> Aggregator:
        return FixedWindowAggregator(rows, release.window, attribute.size)

    def build(self, release: FixedWindowRelease, setting: Setting) -> Any:
        from pipeline.synth.fixed_window import FixedWindowSynthesizer

        return FixedWindowSynthesizer(
            setting.horizon,
            release.window,
            setting.zcdp.rho,
            beta=release.beta,
            categories=setting.domain_size,
            neighbours=setting.neighbours,
            seed=setting.seed,
            n=setting.n,
        )

    def events(
        self, release: FixedWindowRelease, mechanism: Any, setting: Setting
    ) -> tuple[PrivacyEvent | None, ...]:
        """Δ²/(2σ²) at each update step t ≥ k, from the σ² the synthesizer samples with."""
        per_step = ZCDP(mechanism.sensitivity_factor / (2.0 * mechanism.sigma2))
        return tuple(
            per_step if t >= mechanism.window else None for t in range(1, setting.horizon + 1)
        )

    def bounds(self, release: FixedWindowRelease, mechanism: Any, horizon: int) -> ReleaseBounds:
        mech, bins = mechanism, mechanism.n_bins
        return ReleaseBounds(
            release.name,
            release.type,
            mech.beta,
            {
                "lambda": mech.accuracy_bound,
                "sigma2": mech.sigma2,
                "padding_records": mech.n_pad * bins,
            },
            "lambda",
            padding=mech.n_pad,
            meaning="window counts",
            notes=[
                f"{mech.n_pad} padding records for each of the {bins} length-{mech.window} patterns "
                f"(m ≈ n + {mech.n_pad * bins}); subtract n_pad to debias a count"
            ],
        )

    # -- reading side ---------------------------------------------------------------------------
    bound_source = (
        "every projected window count is within λ of its true count + n_pad, at every step "
        "(Bun–Gaboardi–Neunhoeffer–Zhang, arXiv 2306.07884, Thm 3.2)"
    )

    def first_step(self, release: FixedWindowRelease) -> int:
        return release.window

    def questions(
        self, release: FixedWindowRelease, unit: str = "step"
    ) -> tuple[list[str], list[str]]:
        k = release.window
        return (
            [
                f"how many users had each length-{k} pattern in the {k} {unit}s ending at {unit} t (t ≥ {k}), and any "
                f"question that is a sum of such patterns (e.g. 'at least 2 of the last {k} {unit}s'), at every {unit}"
            ],
            [
                f"questions over more than {k} {unit}s, or since {unit} 1 ('ever', 'at least b {unit}s so far'): "
                "a cumulative release answers those; the synthetic records are not longitudinal beyond the window"
            ],
        )

    def answer(
        self,
        release: FixedWindowRelease,
        panel: Panel,
        step: int,
        ctx: Context,
        raw: bool = False,
        group: str | None = None,
    ) -> Answer:
        """The window pattern counts at ``step``, debiased (the n_pad padding per pattern subtracted)
        unless ``raw``; intervals ± λ (every projected count is within λ of its true count + n_pad, at
        every step at once, with probability ≥ 1 − β)."""
        from pipeline.queries import window_histogram

        from .reading import CLIPPING, Answer, Row, interval, pattern_labels

        if step < release.window:
            raise ValueError(
                f"release {release.name!r} counts windows of {release.window} steps: the first full "
                f"window ends at step {release.window}, got step {step}"
            )
        p = panel.parameters
        k, a, n_pad, lam = (
            int(p["window"]),
            int(p["categories"]),
            int(p["n_pad"]),
            float(p["accuracy_bound"]),
        )
        n, unit = ctx.n, ctx.unit
        counts = window_histogram(panel.as_array(), step, k, a).astype(np.int64)
        shown = counts if raw else counts - n_pad
        labels = pattern_labels(ctx.attribute, k, unit)
        rows = []
        for code, (label, c) in enumerate(zip(labels, shown.tolist())):
            lo, hi = interval(float(c), lam, None if raw else n)
            rows.append(Row(label, float(c), lo, hi, None if raw else n, key=code))
        notes = (
            [
                f"raw counts of the synthetic records: each includes {n_pad} padding records (public), so shares "
                f"of them are biased towards 1/{a**k}; drop --raw for the debiased answer"
            ]
            if raw
            else [
                f"padding removed: {n_pad} padding records per pattern (public, added so that the noisy counts "
                f"are non-negative and records can be built from them) are subtracted; shares are of n = {n:,} "
                f"users, not of the {panel.as_array().shape[0]:,} synthetic records",
                CLIPPING,
            ]
        )
        return Answer(
            release.name,
            release.type,
            step,
            f"users by their {release.attribute} pattern over the {k} {unit}s ending at {unit} {step}",
            rows,
            bound=f"± λ = {lam:,.1f}: every window count, at every step, within λ with probability "
            f"≥ {1 - float(p['beta']):g} (Bun, Gaboardi, Neunhoeffer, Zhang, arXiv 2306.07884, "
            "Thm 3.2)",
            notes=notes,
            legacy={"debiased": not raw, "counts": shown.tolist(), "n_pad": n_pad},
        )

    def dictionary(self, release: FixedWindowRelease, panel: Panel, ctx: Context) -> dict[str, Any]:
        from .reading import pattern_labels

        n_pad = int(panel.parameters["n_pad"])
        return {
            "n_pad_per_pattern": n_pad,
            "patterns": dict(enumerate(pattern_labels(ctx.attribute, release.window, ctx.unit))),
            "padding": f"{n_pad} padding records per length-{release.window} pattern (public) make the noisy counts "
            "non-negative so records can be built from them; the records are exchangeable, so no one "
            "set of records is the padding of every window: the column `padding_step_t` marks a "
            f"choice of {n_pad} records per pattern of the window ending at step t, and dropping "
            "them (df[~df.padding_step_t]) answers that window's questions debiased",
        }

    def padding_flags(
        self, release: FixedWindowRelease, panel: Panel, step: int | None = None
    ) -> np.ndarray | None:
        """A choice of n_pad records per pattern of the window ending at ``step`` (default: the last
        released); the records are exchangeable, so no one choice is the padding of every window."""
        from pipeline.queries import window_codes

        p, arr = panel.parameters, panel.as_array()
        step = arr.shape[1] if step is None else step
        if step < release.window or step > arr.shape[1]:
            return None
        codes = window_codes(arr, step, int(p["window"]), int(p["categories"]))
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        first = np.searchsorted(sorted_codes, sorted_codes, side="left")
        flags = np.zeros(codes.size, dtype=bool)
        flags[order] = (np.arange(codes.size) - first) < int(p["n_pad"])
        return flags

    def explain(self, bounds: ReleaseBounds, n: int) -> str:
        from .reading import confidence, points

        lam = bounds.bounds["lambda"]
        return (
            f"with probability {confidence(bounds.beta)}, every published window share is within ±"
            f"{points(lam, n)} of the truth (λ = {lam:,.1f} users of n = {n:,}), at every step at once"
        )

    def observe(self, manifest: dict[str, Any], alerts: dict[str, Any] | None) -> dict[str, float]:
        clamped = manifest.get("clamped_bins", 0)
        return {"padding_clamps": float(clamped)} if clamped else {}

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
