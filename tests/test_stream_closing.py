"""Closing rules: the deadline clock runs from public events only and yields scheduled times;
close markers carry the public close time through the worker's partial."""

from __future__ import annotations

import pytest

from pipeline.config import parse_config
from pipeline.stream.releaser.closing import DeadlineClock, public_close_time
from pipeline.stream.ingest.core import IngestCore, Record
from pipeline.stream.kafka.messages import CONTROL_HEADER, close_marker, parse_close_marker
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names


def test_deadline_is_scheduled_from_the_last_public_close_not_from_when_it_was_noticed():
    clock = DeadlineClock(2.5, opened_ms=10_000)
    assert clock.due(12_499) is None
    # noticed late (the releaser was busy releasing the previous step): still the scheduled time
    assert clock.due(13_900) == 12_500
    clock.closed(12_500)
    assert clock.due(14_999) is None and clock.due(15_000) == 15_000
    clock.closed(20_000)  # a close command at 20 s restarts the clock from its time
    assert clock.due(22_499) is None and clock.due(22_500) == 22_500


def test_control_mode_never_comes_due():
    assert DeadlineClock(None, opened_ms=0).due(10**15) is None


def test_public_close_time_is_the_latest_marker_time():
    assert public_close_time([{"closed_at": 5}, {"closed_at": 7}, {"closed_at": None}]) == 7
    assert public_close_time([{"x": 1}, {"closed_at": None}]) is None


@pytest.mark.parametrize("value, want", [
    (close_marker(3, 1_700_000_000_123), (3, 1_700_000_000_123)),
    (b'{"step": 2}', (2, None)),  # a marker of an earlier version
    (b'{"step": 2, "closed_at": -5}', (2, None)),
    (b'{"step": 0, "closed_at": 5}', (None, 5)),
    (b"[1]", (None, None)),
    (b"{", (None, None)),
])
def test_parse_close_marker(value, want):
    assert parse_close_marker(value) == want


def test_the_markers_close_time_travels_in_the_partial():
    from pipeline.serialization import loads_state

    dep = parse_config({"name": "closing", "roster": {"size": 20}, "horizon": 3, "topics": {"partitions": 1},
                        "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 1.0},
                        "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}]})
    core = IngestCore(dep, Roster.from_config(dep.roster), topic_names(dep), isolated=True)
    core.assign(0)
    core.enqueue(0, [Record(0, close_marker(1, 1_700_000_123_456), ((CONTROL_HEADER, b"close"),))])
    (out,) = core.drain(0)
    chunks = [loads_state(v) for _, v in out.messages]
    partial = loads_state(b"".join(c["data"].tobytes() for c in chunks))
    assert partial["step"] == 1 and partial["closed_at"] == 1_700_000_123_456
