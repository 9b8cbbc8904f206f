"""Neighbouring streams through the worker's own aggregation (privacy property tests and audits).

A stream deployment's neighbouring relation is *replace*: two streams differ in one user's whole
sequence of reports, any sequence including the all-missing one (docs/privacy.md). These helpers
feed such streams through the code the workers run — :class:`PartitionState` (stateful checks,
imputation, the release aggregators) — and, for :func:`run_stream`, through the releaser's
:class:`ReleaseEngine`, so what is measured is what a deployment publishes.

Reports are given per attribute as an (n, steps) int64 matrix of domain codes, −1 where the user
sent nothing (then the worker imputes: carry-forward or the configured default).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.stream.ingest.partition_state import PartitionState
from pipeline.stream.ingest.reports import ParsedReports

__all__ = ["whole_roster_state", "feed_and_close", "CoupledWorlds", "run_stream"]


def whole_roster_state(deployment) -> PartitionState:
    """One partition owning the whole roster (partials add across partitions, so one suffices)."""
    return PartitionState(deployment, 0, np.arange(deployment.n), deployment.n)


def feed_and_close(state: PartitionState, step: int, reports: dict[str, np.ndarray]) -> dict[str, Any]:
    """Apply step ``step``'s reports (``reports[attr]``: (n,) codes, −1 = not reported) as a worker
    does, then close the step: imputation and every release's partial aggregate."""
    codes = {a: np.asarray(reports[a], dtype=np.int64) for a in state.attributes}
    sent = np.zeros(state.rows.size, dtype=bool)
    for c in codes.values():
        sent |= c >= 0
    rows = np.flatnonzero(sent)
    parsed = ParsedReports.of_singles(rows, np.full(rows.size, step), {a: c[rows] for a, c in codes.items()})
    state.apply(parsed)
    if parsed.rejections:
        raise ValueError(f"step {step}: reports rejected: {[r.reason for r in parsed.rejections]}")
    return state.close(step)


class CoupledWorlds:
    """World 0 and world 1 of a neighbouring pair, each in its own worker state, driven by one
    public transcript: the releaser's feedback of a step (flags) is applied to both worlds. This is
    the simulation in the target-charging argument (docs/monitors.md §2.1): the analyst knows both
    datasets and the transcript, hence both worlds' active sets."""

    def __init__(self, deployment):
        self.worlds = (whole_roster_state(deployment), whole_roster_state(deployment))

    def close(self, step: int, reports0: dict[str, np.ndarray], reports1: dict[str, np.ndarray]):
        return tuple(feed_and_close(s, step, r) for s, r in zip(self.worlds, (reports0, reports1)))

    def feedback(self, step: int, release: str, feedback: dict[str, Any]) -> None:
        for s in self.worlds:
            s.apply_feedback(step, release, feedback)

    def values(self, world: int, attribute: str) -> np.ndarray:
        """The (reported or imputed) values the last closed step aggregated, per user."""
        return self.worlds[world].last_x[attribute]

    def active(self, world: int, release: str) -> np.ndarray:
        """Per user: still counted by a charging release (fewer charges than its k)."""
        agg = self.worlds[world].aggregators[release]
        return agg.charges < agg.k


def run_stream(deployment, reports: dict[str, np.ndarray], engine) -> list[list]:
    """Every step of ``reports`` through a worker state and ``engine`` (a fresh
    :class:`pipeline.stream.releaser.engine.ReleaseEngine`), feeding each release's feedback back to the
    worker as the stream does. Returns the engine's outputs per step."""
    state = whole_roster_state(deployment)
    steps = next(iter(reports.values())).shape[1]
    out = []
    for t in range(1, steps + 1):
        partial = feed_and_close(state, t, {a: r[:, t - 1] for a, r in reports.items()})
        outputs = engine.release(t, [partial])
        for o in outputs:
            if o.feedback is not None:
                state.apply_feedback(t, o.release, o.feedback)
        out.append(outputs)
    return out
