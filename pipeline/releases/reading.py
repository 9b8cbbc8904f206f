"""The reading side of release kinds: what an analyst gets back from a step's public output.

A kind answers a question about one released step as an :class:`Answer`: labelled :class:`Row` s,
each with the estimate, the interval the mechanism's own error bound gives at the release's β, and
the share of the population n (never of the synthetic records m, which include padding). The
command line (``dpstream query``), the exports' data dictionary and the analyst page
(:mod:`pipeline.analyst`) print these; none of them branches on the release type.

Everything here is post-processing of public records (the manifests, the synthetic columns, the
alerts) and of the public configuration: it costs no privacy and needs no access to the curator's
state (Redis).

Clipping choice (stated once, used by every kind): an estimate is printed as the release gives it —
a debiased count can be negative, because the padding subtracted is public and the noise is not
clipped; clipping estimates at 0 would bias every sum of them upward. Only the *interval* is
clipped to what a count of users can be, [0, n].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from pipeline.attributes import Attribute

__all__ = [
    "Panel",
    "Context",
    "Row",
    "Answer",
    "CLIPPING",
    "binary_word",
    "pattern_labels",
    "cumulative_label",
    "code_labels",
]

CLIPPING = (
    "estimates are shown unclipped (a debiased count can be negative: clipping at 0 would bias sums "
    "upward); only the interval is clipped to [0, n]"
)


class Panel(Protocol):
    """One release's public output as the consumer assembles it
    (``pipeline.consumer.SyntheticPanel``)."""

    manifests: dict[int, dict[str, Any]]
    values: np.ndarray | None
    histograms: dict[int, np.ndarray]

    @property
    def parameters(self) -> dict[str, Any]: ...

    @property
    def released_through(self) -> int: ...

    def as_array(self) -> np.ndarray: ...


@dataclass(frozen=True)
class Context:
    """What a kind reads a release's output with, besides the output: all public."""

    attribute: Any  # the release's attribute model (pipeline.attributes)
    n: int  # the roster size: shares are of n
    bounds: Any  # the release's pipeline.error_bounds.ReleaseBounds (the plan's numbers)
    unit: str = "step"  # what a step is called ("month")


@dataclass(frozen=True)
class Row:
    """One labelled answer: a count of users with its interval, both also as a share of ``n``."""

    label: str
    estimate: float
    low: float | None = None
    high: float | None = None
    n: int | None = None
    key: str | int | None = (
        None  # the machine name of the row (a pattern code, b, a group): same across steps
    )
    series: str = ""  # the label of the row's series over steps, when it differs from ``label``

    def share(self, value: float | None) -> float | None:
        return None if value is None or not self.n else value / self.n

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "key": self.key, "estimate": self.estimate}
        if self.low is not None:
            out["interval"] = [self.low, self.high]
        if self.n:
            out["share"] = self.share(self.estimate)
            if self.low is not None:
                out["share_interval"] = [self.share(self.low), self.share(self.high)]
        return out


@dataclass(frozen=True)
class Answer:
    """A kind's answer about one released step (see the module docstring)."""

    release: str
    type: str
    step: int
    question: str  # what the rows count, in words
    rows: list[Row]
    bound: str = ""  # which bound the intervals come from, in words
    notes: list[str] = field(default_factory=list)
    legacy: dict[str, Any] = field(
        default_factory=dict
    )  # the earlier JSON keys (counts, at_least, answers)

    def as_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "type": self.type,
            "step": self.step,
            "question": self.question,
            "bound": self.bound,
            "notes": list(self.notes),
            "rows": [r.as_json() for r in self.rows],
            **self.legacy,
        }


def interval(estimate: float, half_width: float, n: int | None) -> tuple[float, float]:
    """estimate ± half_width, clipped to [0, n] (a count of users)."""
    low, high = estimate - half_width, estimate + half_width
    return max(0.0, low), (high if n is None else min(float(n), high))


def binary_word(attribute: Attribute) -> str:
    """What code 1 of a binary attribute means in labels ("poor"), or the attribute's ``= 1``."""
    return getattr(attribute, "label", "") or "value 1"


def _ranges(positions: list[int]) -> str:
    """[1, 2, 3, 5] -> "1–3, 5"."""
    parts, start = [], None
    for i, p in enumerate(positions):
        if start is None:
            start = p
        if i + 1 == len(positions) or positions[i + 1] != p + 1:
            parts.append(f"{start}" if start == p else f"{start}–{p}")
            start = None
    return ", ".join(parts)


def pattern_labels(attribute: Attribute, k: int, unit: str = "step") -> list[str]:
    """A label for each of the A^k length-k window patterns, in code order (oldest value most
    significant, :func:`pipeline.queries.pattern_digits`): binary attributes in words ("poor in all 3
    months", "poor in months 2–3 of 3 only"), categorical ones as the sequence of their values."""
    from pipeline.queries import pattern_digits

    digits = pattern_digits(k, attribute.size)
    units = f"{unit}s" if k > 1 else unit
    if attribute.type == "binary":
        word = binary_word(attribute)
        out = []
        for row in digits:
            on = [j + 1 for j, d in enumerate(row) if d]
            code = "".join(str(int(d)) for d in row)
            if len(on) == k:
                text = f"{word} in all {k} {units}" if k > 1 else f"{word}"
            elif not on:
                text = f"{word} in none of the {k} {units}" if k > 1 else f"not {word}"
            else:
                text = f"{word} in {unit}{'s' if len(on) > 1 else ''} {_ranges(on)} of {k} only"
            out.append(f"{text} ({code})")
        return out
    labels = attribute.labels()
    return [" → ".join(labels[int(d)] for d in row) for row in digits]


def cumulative_label(attribute: Attribute, b: int, t: int, unit: str = "step") -> str:
    """The label of the cumulative count S_b^t."""
    word = binary_word(attribute)
    return f"{word} in at least {b} of the first {t} {unit}{'s' if t > 1 else ''}"


def code_labels(attribute: Attribute, codes) -> list[str]:
    """Public labels of attribute codes (declared values, a hashed attribute's dictionary, else the code)."""
    codes = [int(c) for c in np.asarray(codes).ravel()]
    if attribute is None:
        return [f"code {c}" for c in codes]
    if attribute.type == "hashed":
        names = attribute.public_labels(codes)
        return [names.get(str(c), f"code {c}") for c in codes]
    labels = attribute.labels()
    if attribute.type == "binary":
        word = binary_word(attribute)
        return [word if c == 1 else f"not {word}" for c in codes]
    return [labels[c] if 0 <= c < len(labels) else f"code {c}" for c in codes]


def points(count: float, n: int) -> str:
    """A count as percentage points of n: 17 of 2,000 -> "0.85 points"."""
    return f"{100.0 * count / n:.2g} points" if n else f"{count:,.1f}"


def confidence(beta: float) -> str:
    """β = 0.05 -> "95%"."""
    return f"{100.0 * (1.0 - beta):g}%"
