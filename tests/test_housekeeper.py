"""`dpstream up`'s housekeeping runs beside its supervision loop: collecting what the rounds said
never waits on a round under way, a failing round is said and the rounds go on, and the lag watch's
warning still reaches the endpoints record (written by the loop, not by the housekeeping thread).
The kill -9 that a waiting round used to delay is tested on real processes in
tests/test_up_supervision.py."""

from __future__ import annotations

import json
import threading
import time

from support.cli import deployment  # noqa: F401 - a fixture

from pipeline.config import load_config
from pipeline.stream.local.cluster import LocalCluster, endpoints_file
from pipeline.stream.local.housekeeper import Housekeeper


def _lines_within(keeper: Housekeeper, count: int, timeout: float = 10.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        assert time.monotonic() < deadline, f"only {lines} within {timeout:g} s"
        lines += keeper.lines()
        time.sleep(0.01)
    return lines


def test_collecting_the_lines_never_waits_on_a_round_under_way():
    answered, rounds = threading.Event(), []

    def round() -> list[str]:
        rounds.append(1)
        answered.wait()  # a probe of a broker that does not answer
        return [f"round {len(rounds)}"]

    keeper = Housekeeper(round, interval=0.01).start()
    try:
        started = time.monotonic()
        while not rounds:
            time.sleep(0.01)
        assert keeper.lines() == [] and time.monotonic() - started < 5
        answered.set()
        assert _lines_within(keeper, 2)[:2] == ["round 1", "round 2"]
    finally:
        keeper.stop()
        answered.set()


def test_a_failing_round_is_said_and_the_rounds_go_on():
    calls = []

    def round() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the broker is restarting")
        return ["sampled"]

    keeper = Housekeeper(round, interval=0.01).start()
    try:
        first, second = _lines_within(keeper, 2)[:2]
    finally:
        keeper.stop()
    assert "housekeeping round failed: ConnectionError('the broker is restarting')" in first
    assert second == "sampled"


def test_the_lag_watch_warning_comes_and_goes_in_the_endpoints_record(deployment, monkeypatch):
    path, env = deployment
    monkeypatch.setenv("DPSTREAM_HOME", env["DPSTREAM_HOME"])
    config = load_config(path)
    cluster = LocalCluster(path, config, data_dir=path.parent / "data")
    record = endpoints_file(config.name)
    warning = "01:02:03 the workers are falling behind: 20,000 records not handled"
    cluster.falling_behind = warning  # as housekeeping() sets it, in its thread
    assert cluster.housekeeping_lines() == []
    assert json.loads(record.read_text())["falling_behind"] == warning
    cluster.falling_behind = None  # the backlog shrank
    cluster.housekeeping_lines()
    assert "falling_behind" not in json.loads(record.read_text())
