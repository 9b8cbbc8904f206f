"""Worker-side partial aggregates, one aggregator per configured release (chosen by the release's
kind: ``kind.aggregator``; the workers, ``pipeline.stream.ingest.partition_state``, only drive them).

At the close of step t a worker holds, for the users of one reports partition, the step's value of
every attribute (reported or imputed). Each aggregator turns those values into the release's
additive partial aggregate and keeps the small per-user state the release needs next step. Partial
aggregates add across partitions, so the release is identical whatever the number of workers.

These hold true (curator-side) counts: they travel on the internal ``step-partials`` topic only.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

__all__ = [
    "Aggregator",
    "narrow_int",
    "FixedWindowAggregator",
    "CumulativeAggregator",
    "ActiveSetAggregator",
]


class Aggregator(Protocol):
    """What a worker drives per release and reports partition (the kind's ``aggregator``)."""

    def partial(self, step: int, x: np.ndarray) -> dict[str, Any]:
        """The step's additive partial aggregate of the users' values ``x`` (codes)."""
        ...

    def apply_feedback(self, step: int, x: np.ndarray, feedback: dict[str, Any]) -> None:
        """Apply the releaser's output of ``step`` (e.g. charge the users of flagged values)."""
        ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...


def narrow_int(largest: int) -> np.dtype:
    """The narrowest signed integer type holding every value in [-1, largest] (-1: the sentinel of
    per-user state). Per-user state is held in it: a worker's memory and checkpoint scale with the
    roster, and int64 would take 8x what int8 does."""
    return np.min_scalar_type(-(max(int(largest), 0) + 1))


class FixedWindowAggregator:
    """Window-pattern counts C_s^t (Bun et al. 2024, Alg. 1): s = the user's last k values, base A digits.

    State: each user's last k−1 closed values as one integer code (base A), so the pattern at t is
    ``suffix * A + x_t``. Nothing is counted before t = k (the first window is complete at t = k).
    """

    kind = "fixed_window"

    def __init__(self, rows: int, window: int, categories: int):
        self.window, self.categories = int(window), int(categories)
        self._mod = self.categories ** (self.window - 1)
        self.suffix = np.zeros(rows, dtype=narrow_int(self._mod))  # in [0, A^(k-1))

    def partial(self, step: int, x: np.ndarray) -> dict[str, Any]:
        pattern = self.suffix.astype(np.int64) * self.categories + x
        counts = None
        if step >= self.window:
            counts = np.bincount(pattern, minlength=self.categories**self.window).astype(np.int64)
        self.suffix = (
            (pattern % self._mod).astype(self.suffix.dtype)
            if self._mod > 1
            else np.zeros_like(self.suffix)
        )
        return {"counts": counts}

    def apply_feedback(self, step: int, x: np.ndarray, feedback: dict[str, Any]) -> None:
        raise ValueError("fixed-window releases take no feedback")

    def get_state(self) -> dict[str, Any]:
        return {"suffix": self.suffix.copy()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.suffix = np.array(state["suffix"], dtype=self.suffix.dtype)  # older checkpoints: int64


class CumulativeAggregator:
    """z_b^t = #{users with weight b−1 after t−1 and x_t = 1}, b = 1..T (Bun et al. 2024, Alg. 2)."""

    kind = "cumulative"

    def __init__(self, rows: int, horizon: int):
        self.horizon = int(horizon)
        self.weight = np.zeros(rows, dtype=narrow_int(self.horizon + 1))  # in [0, T]

    def partial(self, step: int, x: np.ndarray) -> dict[str, Any]:
        ones = x == 1
        z = np.bincount(self.weight[ones] + 1, minlength=self.horizon + 1).astype(np.int64)
        self.weight += ones.astype(self.weight.dtype)
        return {"z": z}  # z[0] is always 0; z[b] for b = 1..T

    def apply_feedback(self, step: int, x: np.ndarray, feedback: dict[str, Any]) -> None:
        raise ValueError("cumulative releases take no feedback")

    def get_state(self) -> dict[str, Any]:
        return {"weight": self.weight.copy()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.weight = np.array(state["weight"], dtype=self.weight.dtype)


class ActiveSetAggregator:
    """Per-element counts over the users still active, and the per-user counters that retire them.

    Heavy hitters (ThresholdMonitorEvolving, Kaplan–Mansour–Stemmer Alg. 5; individual charging, Cohen–Lyu):
    a user's counter c(j) grows each time the element it holds is flagged; at c(j) = k the user is
    no longer counted. Band monitors (Ghazi et al., PREM): a user leaves once it contributed to an
    Above/Below answer (k = 1). ``counted == False`` (naive / restarted-SVT baselines) counts
    everyone and keeps no counters.
    """

    kind = "active_set"

    def __init__(self, rows: int, k: int, counted: bool = True, watch_value: int | None = None):
        self.k = int(k)
        self.counted = bool(counted)
        self.watch_value = watch_value
        self.charges = np.zeros(rows, dtype=narrow_int(self.k + 1))  # in [0, k]

    def _active(self) -> np.ndarray:
        return self.charges < self.k if self.counted else np.ones(self.charges.size, dtype=bool)

    def partial(self, step: int, x: np.ndarray) -> dict[str, Any]:
        held = x[self._active()]
        if self.watch_value is not None:
            return {"count": int(np.count_nonzero(held == self.watch_value))}
        elements, counts = _element_counts(held)
        return {"elements": elements.astype(np.int64), "counts": counts.astype(np.int64)}

    def apply_feedback(self, step: int, x: np.ndarray, feedback: dict[str, Any]) -> None:
        """Charge the active users who hold a flagged element (``feedback['flagged']``)."""
        if not self.counted:
            return
        flagged = np.asarray(feedback.get("flagged", []), dtype=np.int64)
        if flagged.size == 0:
            return
        charge = self._active() & np.isin(x, flagged)
        self.charges[charge] += 1

    def get_state(self) -> dict[str, Any]:
        return {"charges": self.charges.copy()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.charges = np.array(state["charges"], dtype=self.charges.dtype)


def _element_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)``, by counting instead of sorting when the values are
    codes dense enough (largest below 8x their number): the same arrays, without the sort that
    dominated a partition's close."""
    if values.size and values.min() >= 0 and values.max() < 8 * values.size:
        counts = np.bincount(values)
        elements = np.flatnonzero(counts)
        return elements, counts[elements]
    return np.unique(values, return_counts=True)
