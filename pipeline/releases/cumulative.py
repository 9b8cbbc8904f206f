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

from typing import Any, Literal

import numpy as np
from pydantic import Field

from pipeline.attributes import Attribute
from pipeline.privacy.events import ZCDP

from .aggregators import Aggregator, CumulativeAggregator
from .base import CountsKind, PrivacyEvent, ReleaseConfig, Setting, StepInput, StepOutput, register
from .bounds import ReleaseBounds
from .reading import Answer, Context, Panel

__all__ = ["CumulativeRelease", "CumulativeKind"]


class CumulativeRelease(ReleaseConfig):
    type: Literal["cumulative"]
    beta: float = Field(default=0.05, gt=0, lt=1)
    counter: Literal["auto", "factorization", "blt", "tree"] = Field(
        default="auto",
        description="continual counter behind each cumulative count: auto (the square-root factorization "
        "up to a horizon of 1024 steps, the BLT above), factorization (lower error than the "
        "tree, O(T) per step), blt (the same error within 0.2%, constant time and memory per "
        "step) or the binary tree of the paper (docs/synthesizers.md §9)",
    )


@register
class CumulativeKind(CountsKind[CumulativeRelease]):
    name = "cumulative"
    config = CumulativeRelease
    budget = "zcdp"
    synthetic = True

    def check(self, release: CumulativeRelease, attribute: Attribute, horizon: int) -> None:
        if attribute.type != "binary":
            raise ValueError("attribute: cumulative releases need a binary attribute")

    def aggregator(
        self, release: CumulativeRelease, attribute: Attribute, rows: int, horizon: int
    ) -> Aggregator:
        return CumulativeAggregator(rows, horizon)

    def build(self, release: CumulativeRelease, setting: Setting) -> Any:
        from pipeline.synth.cumulative import CumulativeSynthesizer

        return CumulativeSynthesizer(
            setting.horizon,
            setting.zcdp.rho,
            beta=release.beta,
            neighbours=setting.neighbours,
            seed=setting.seed,
            n=setting.n,
            counter=release.counter,
        )

    def events(
        self, release: CumulativeRelease, mechanism: Any, setting: Setting
    ) -> tuple[PrivacyEvent | None, ...]:
        """Counter b's realised ρ at step b (when it starts)."""
        return tuple(ZCDP(c.realised_rho) for c in mechanism.counters)

    def bounds(self, release: CumulativeRelease, mechanism: Any, horizon: int) -> ReleaseBounds:
        return ReleaseBounds(
            release.name,
            release.type,
            mechanism.beta,
            {"error": mechanism.error_bound()},
            "error",
            meaning="cumulative counts",
            notes=[f"{mechanism.counter} counters; m = n records, no padding"],
        )

    # -- reading side ---------------------------------------------------------------------------
    bound_source = (
        "every 'at least b of t steps' count is within this of the truth, for all b and t "
        "(Bun–Gaboardi–Neunhoeffer–Zhang, Cor. B.1 with the counters' exact variances)"
    )

    def questions(
        self, release: CumulativeRelease, unit: str = "step"
    ) -> tuple[list[str], list[str]]:
        return (
            [
                f"how many users were 1 in at least b of {unit}s 1..t, for every b and t (e.g. 'ever', 'at least "
                f"half of the {unit}s so far'), at every {unit}"
            ],
            [
                f"which {unit}s or in which order (a window release answers pattern questions): the records keep "
                "each user's running total, not when the 1s happened"
            ],
        )

    def answer(
        self,
        release: CumulativeRelease,
        panel: Panel,
        step: int,
        ctx: Context,
        raw: bool = False,
        group: str | None = None,
    ) -> Answer:
        """S_b^t = #users 1 in at least b of the first t steps, b = 1..t, ± the release's bound (every
        (b, t) at once with probability ≥ 1 − β); the records are n, no padding (``raw`` changes nothing)."""
        from pipeline.queries import cumulative_counts

        from .reading import CLIPPING, Answer, Row, binary_word, cumulative_label, interval

        arr = panel.as_array()
        if not 1 <= step <= arr.shape[1]:
            raise ValueError(f"step must be in 1..{arr.shape[1]} (released so far), got {step}")
        counts = cumulative_counts(arr[:, :step])[step - 1]
        error, n = float(ctx.bounds.bounds["error"]), ctx.n
        rows = []
        for b in range(1, step + 1):
            c = float(counts[b]) if b < counts.size else 0.0
            lo, hi = interval(c, error, n)
            rows.append(
                Row(
                    cumulative_label(ctx.attribute, b, step, ctx.unit),
                    c,
                    lo,
                    hi,
                    n,
                    key=b,
                    series=f"{binary_word(ctx.attribute)} in at least {b} {ctx.unit}{'s' if b > 1 else ''} so far",
                )
            )
        assert panel.values is not None  # a records release: as_array() above read them
        horizon = panel.values.shape[
            1
        ]  # S_b^t for b = 0..T, zero beyond t (the earlier JSON's at_least)
        at_least = np.concatenate([counts, np.zeros(horizon + 1 - counts.size, dtype=counts.dtype)])
        return Answer(
            release.name,
            release.type,
            step,
            f"users by how many of the first {step} {ctx.unit}s they were {binary_word(ctx.attribute)}",
            rows,
            bound=f"± {error:,.1f}: every 'at least b of the first t' count, for all b and t at once, "
            f"with probability ≥ {1 - ctx.bounds.beta:g} (Bun, Gaboardi, Neunhoeffer, Zhang, "
            "arXiv 2306.07884, Cor. B.1 with the counters' exact variances)",
            notes=[
                f"no padding: the {arr.shape[0]:,} records are the n users; shares are of n = {n:,}",
                CLIPPING,
            ],
            legacy={"at_least": at_least.tolist()},
        )

    def explain(self, bounds: ReleaseBounds, n: int) -> str:
        from .reading import confidence, points

        error = bounds.bounds["error"]
        return (
            f"with probability {confidence(bounds.beta)}, every 'at least b of the first t steps' share is "
            f"within ±{points(error, n)} of the truth ({error:,.1f} users of n = {n:,}), for all b and t at once"
        )

    def release_step(self, s: StepInput) -> StepOutput:
        mech, manifest = s.mechanism, s.manifest
        z = np.sum([p["z"] for p in s.parts], axis=0)
        columns = mech.release_counts(z)
        manifest["parameters"] = mech.parameters()
        manifest["noisy_counts"] = mech.noisy_counts[s.step].tolist()
        manifest["monotone_counts"] = mech.monotone_counts[s.step].tolist()
        return StepOutput(columns=columns, column_steps=[s.step])
