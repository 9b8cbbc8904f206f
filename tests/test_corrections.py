"""Corrections on one partition's state: log positions decide, never arrival order, and the arrays
exist only while a correction is held (pipeline.stream.ingest.corrections)."""

from __future__ import annotations

from itertools import permutations

import numpy as np

from pipeline.config import parse_config
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.ingest.partition_state import PartitionState
from pipeline.stream.ingest.reports import ParsedReports

N = 5
DEP = parse_config({
    "name": "corr", "roster": {"size": N}, "horizon": 4, "topics": {"partitions": 2},
    "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 1.0},
    "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}],
})


def state() -> PartitionState:
    return PartitionState(DEP, 0, np.arange(N), N)


def reports(rows, steps, values) -> ParsedReports:
    return ParsedReports.of_singles(rows, steps, {"pov": np.asarray(values, dtype=np.int64)})


# (kind, origin, position, value) of reports for user 1 at step 1: first reports and corrections
# from the partition's own log (origin 0) and forwarded from source partition 1 (origin 2)
EVENTS = [("first", 0, None, 0), ("fix", 0, 10, 1), ("fix", 2, 5, 0), ("first", 2, None, 1), ("fix", 0, 3, 0)]


def run(order) -> tuple[int, int]:
    """(held value, reports rejected) after the events in ``order`` (each log keeps its own order)."""
    ps, rejected = state(), 0
    for kind, origin, position, value in order:
        parsed = reports([1], [1], [value])
        if kind == "fix":
            displaced: list = []
            ps.replace(parsed, origin, np.array([position]), displaced)
            rejected += len(displaced)
        else:
            displaced = []
            ps.apply(parsed, origin, displaced)
            rejected += len(displaced)
        rejected += len(parsed.rejections)
    return int(ps.pending["pov"][0, 1]), rejected


def test_the_outcome_does_not_depend_on_how_the_logs_interleave():
    outcomes = set()
    for order in permutations(EVENTS):
        own = [e for e in order if e[1] == 0]
        if [e for e in own if e[0] == "fix"] != sorted((e for e in own if e[0] == "fix"), key=lambda e: e[2]):
            continue  # positions of one log increase in its order
        outcomes.add(run(order))
    # the direct log's last correction (position 10, value 1) wins, whatever the order; dead-lettered
    # (as a duplicate, or displaced): the forwarded correction, and the forwarded first report,
    # which the direct one outranks; the direct first report and the earlier direct correction are
    # superseded, not rejected
    assert outcomes == {(1, 2)}


def test_a_correction_replaces_the_whole_report_and_a_first_report_after_it_is_a_duplicate():
    ps = state()
    ps.apply(reports([0, 1], [1, 1], [1, 1]), 0)
    applied = ps.replace(reports([0, 0, 2], [1, 1, 2], [0, 1, 0]), 0, np.array([7, 8, 9]))
    assert len(applied) == 3 and ps.pending["pov"][0, 0] == 1 and ps.pending["pov"][1, 2] == 0
    again = reports([0], [1], [0])
    ps.apply(again, 0)
    assert [r.reason for r in again.rejections] == ["duplicate"] and ps.pending["pov"][0, 0] == 1
    first = ps.apply(reports([2], [2], [1]), 0)  # a first report after a correction: superseded
    assert len(first) == 1 and ps.pending["pov"][1, 2] == 0
    assert ps.intake.reported.tolist() == [2, 1, 0]  # users with a report per open step, once each


def test_corrections_survive_a_checkpoint_and_vanish_once_their_steps_closed():
    ps = state()
    assert "corrections" not in ps.get_state()  # a deployment that never corrects stores nothing more
    ps.replace(reports([3], [2], [1]), 0, np.array([4]))
    restored = state()
    restored.set_state(loads_state(dumps_state(ps.get_state())))
    late = reports([3], [2], [0])
    restored.replace(late, 0, np.array([2]))  # an earlier position of the same log: a replay's copy
    assert restored.pending["pov"][1, 3] == 1 and late.rejections
    for step in (1, 2):
        restored.close(step)
        restored.feedback_needed.clear()
    assert restored.last["pov"][3] == 1 and restored.corrections is None
    assert "corrections" not in restored.get_state()
    fix = reports([3], [2], [0])
    restored.replace(fix, 0, np.array([99]))
    assert [r.reason for r in fix.rejections] == ["late"]
