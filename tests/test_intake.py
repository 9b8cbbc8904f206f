"""Intake counts (accepted, rejected by reason, reported/imputed per step) and the close assessment."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from pipeline.config import parse_config
from pipeline.plan import planned_schedule, spend_of_steps
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.ingest.core import IngestCore, Record
from pipeline.stream.ingest.intake_view import IntakeView, close_assessment, open_window
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names

N, T = 20, 6


def _dep(**extra):
    return parse_config({
        "name": "intake", "roster": {"size": N}, "horizon": T, "topics": {"partitions": 1},
        "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 1.0},
        "releases": [{"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.5},
                     {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5}], **extra})


def _report(user: int, step: int, value=1) -> bytes:
    return orjson.dumps({"user": f"u{user}", "step": step, "values": {"pov": value}})


def _marker(step: int) -> tuple:
    return orjson.dumps({"step": step}), ((CONTROL_HEADER, b"close"),)


def _log():
    """Step 1: 15 users, a duplicate, 2 malformed; step 2 (ahead): 4 users; close 1; step 2: 6 more; 1 late."""
    values = [_report(u, 1) for u in range(15)] + [_report(0, 1), b"{", b"[]"] + [_report(u, 2) for u in range(4)]
    values += [_marker(1)] + [_report(u, 2) for u in range(4, 10)] + [_report(19, 1)]
    return [Record(i, *v) if isinstance(v, tuple) else Record(i, v) for i, v in enumerate(values)]


def _core(dep):
    core = IngestCore(dep, Roster.from_range(N), topic_names(dep), isolated=True)
    core.assign(0)
    return core


def test_intake_counts_per_step_and_interval():
    dep = _dep()
    core = _core(dep)
    core.enqueue(0, _log())
    core.drain(0)
    s = core.states[0].intake_summary()
    # the close marker of step 1 is record 22: where `produce --dry-run` starts reading
    assert s["history"]["1"] == {"users": N, "reported": 15, "imputed": 5, "accepted": 19,
                                 "rejected": {"duplicate": 1, "malformed": 2}, "forwarded": 0,
                                 "marker": 22}
    assert s["open"] == {"2": 10, "3": 0, "4": 0}  # 4 sent while step 1 was open + 6 after
    assert s["accepted"] == 6 and s["rejected"] == {"late": 1}


def test_intake_counts_survive_a_replay_exactly_once():
    """Restore the checkpoint written at the close of step 1, replay the records after the marker:
    the same counts as the uninterrupted run (breaks if intake is not in the checkpoint, or if a
    replay counts twice)."""
    dep = _dep()
    log = _log()
    marker = next(r.offset for r in log if r.headers)
    whole = _core(dep)
    whole.enqueue(0, log)
    blob = next(o.checkpoint for o in whole.drain(0) if hasattr(o, "checkpoint"))
    replay = _core(dep)
    replay.states[0].set_state(loads_state(blob))
    replay.enqueue(0, log[marker + 1:])
    replay.drain(0)
    assert replay.states[0].intake_summary() == whole.states[0].intake_summary()
    again = _core(dep)
    again.states[0].set_state(loads_state(dumps_state(whole.states[0].get_state())))
    again.enqueue(0, log)  # everything already handled: nothing is counted again
    again.drain(0)
    assert again.states[0].intake_summary() == whole.states[0].intake_summary()


def _view(dep, history: dict, open_reported: dict, accepted=0, rejected=None, closing=None):
    closed = max(map(int, history), default=0)
    snap = {"partition": 0, "closed": closed, "offset": 0, "users": N, "accepted": accepted,
            "rejected": rejected or {}, "history": history, "open": {str(t): r for t, r in open_reported.items()}}
    return IntakeView(closed if closing is None else closing, 1, {0: snap})


def _hist(reported: int, accepted: int, rejected: dict | None = None) -> dict:
    return {"users": N, "reported": reported, "imputed": N - reported, "accepted": accepted, "rejected": rejected or {}}


def test_close_assessment_against_the_median_of_closed_steps():
    dep = _dep(close_guard={"warn_above": 0.05})
    # closed steps imputed 10%, 10%, 50% -> median 10%; rejected 0%, 50%, 0% -> median 0%
    history = {"1": _hist(18, 18), "2": _hist(18, 9, {"malformed": 9}), "3": _hist(10, 10)}
    view = _view(dep, history, {4: 16, 5: 12, 6: 0}, accepted=30, rejected={"malformed": 3})
    checks = {c.step: c for c in close_assessment(dep, view, range(4, 7))}
    # step 4: 20% imputed (> 10% + 5%: warns), rejected 3/33 = 9.1% (> 5%: warns)
    assert checks[4].imputed_share == pytest.approx(0.2) and checks[4].rejected_share == pytest.approx(3 / 33)
    assert len(checks[4].warnings) == 2
    # step 5: 40% imputed warns; no rejections counted for it yet
    assert len(checks[5].warnings) == 1 and checks[5].rejected == {}
    assert checks[6].reported == 0 and "20 of 20 users have no report" in checks[6].warnings[0]
    quiet = close_assessment(dep, _view(dep, history, {4: 18}), range(4, 5))[0]
    assert quiet.warnings == []  # exactly the median: nothing to say


def test_close_guard_is_advisory_only():
    """A guard that refuses ties whether a step closes now to an un-noised count of who reported
    (docs/privacy.md, "Closing rules and timing"): the assessment has no refusal, and a configuration
    asking for one is refused, naming the key and why."""
    from pipeline.config import ConfigError
    from pipeline.stream.ingest.intake_view import StepCheck

    assert "refuse" not in StepCheck.__dataclass_fields__
    with pytest.raises(ConfigError, match=r"close_guard\.refuse_above: .*un-noised count"):
        _dep(close_guard={"warn_above": 0.05, "refuse_above": 0.25})
    assert _dep(close_guard={"refuse_above": None}).close_guard.refuse_above is None
    assert _dep().close_guard.refuse_above is None


def test_close_assessment_first_step_compares_with_nothing_lost():
    dep = _dep()
    view = _view(dep, {}, {1: 10})
    (check,) = close_assessment(dep, view, range(1, 2))
    assert check.imputed_share == 0.5 and check.warnings  # 50% imputed against 0 with no closed step: a warning


def test_spend_of_steps_is_the_planned_schedule():
    dep = _dep()
    sched = planned_schedule(dep)
    allot = dep.budget_plan().allotments()
    spend = spend_of_steps(dep, range(1, 4))
    assert spend["fw"]["rho"] == pytest.approx(sched["fw"][:3].sum())  # steps 2, 3 (window 2)
    assert spend["cu"]["rho"] == pytest.approx(sched["cu"][:3].sum())
    assert spend["fw"]["share_of_release"] == pytest.approx(sched["fw"][:3].sum() / allot["fw"].rho)
    assert "fw" not in spend_of_steps(dep, range(1, 2))  # a window-2 release spends nothing at step 1
    everything = spend_of_steps(dep, range(1, T + 1))
    assert all(v["share_of_release"] == pytest.approx(1.0) for v in everything.values())


def test_open_window():
    dep = _dep(steps={"max_ahead": 2})
    assert list(open_window(dep, 0)) == [1, 2, 3]
    assert list(open_window(dep, 4)) == [5, 6]
    assert list(open_window(dep, T)) == []
    assert np.all(np.diff(list(open_window(dep, 1))) == 1)
