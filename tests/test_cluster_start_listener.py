"""A cluster whose clients and broker speak different protocols fails within a bound, in one line.

Real embedded broker (plain, and behind its mutual-TLS gate) and Redis; `LocalCluster.start` creates
the topics with kafka-python's admin client, whose bootstrap waited forever for the TLS handshake of a
TLS client against a plain broker (the broker reads the ClientHello as the size of a huge request and
waits for the rest). Each start runs in a thread here so that a hang fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import threading
import time

import pytest

from jobs.eval.testbed import write_panel_deployment
from pipeline.config import load_config
from pipeline.stream.kafka.listener_check import ListenerMismatch
from pipeline.stream.local.broker_tls import BROKER_TLS_ENV, ensure_broker_tls
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.embedded import EmbeddedServices

BOUND = 3.0  # DPSTREAM_BROKER_WAIT_SECONDS of these tests
SLACK = 10.0  # one attempt's socket timeout (5 s) and a loaded machine


def _start_failure(tmp_path, services, name: str) -> tuple[BaseException | None, float]:
    """What `LocalCluster.start` raised and after how many seconds; fails if it still runs after
    the bound and the slack."""
    dep = load_config(write_panel_deployment(tmp_path, services, name, n=10, horizon=3))
    cluster = LocalCluster(tmp_path / f"{name}.yaml", dep, log_dir=tmp_path / "logs")
    raised: list[BaseException] = []

    def start() -> None:
        try:
            cluster.start()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            raised.append(err)

    started = time.monotonic()
    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(BOUND + SLACK)
    elapsed = time.monotonic() - started
    try:
        assert not thread.is_alive(), f"LocalCluster.start still waiting after {elapsed:.0f} s"
    finally:
        cluster.stop()
    return (raised[0] if raised else None), elapsed


@pytest.fixture
def bounded_wait(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSTREAM_BROKER_WAIT_SECONDS", str(BOUND))
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))


def test_a_tls_client_against_a_plain_broker_fails_within_the_bound(tmp_path, monkeypatch,
                                                                   bounded_wait):
    tls = ensure_broker_tls(tmp_path / "broker-tls")
    monkeypatch.setenv(BROKER_TLS_ENV, str(tls.directory))
    with EmbeddedServices() as plain:
        err, elapsed = _start_failure(tmp_path, plain, "probe-tls-client")
    assert isinstance(err, ListenerMismatch), repr(err)
    line = str(err)
    assert "\n" not in line
    assert "speaks plain Kafka" in line and "set up for TLS" in line, line
    assert BROKER_TLS_ENV in line  # the setting that made the client speak TLS
    assert elapsed < BOUND + SLACK


def test_a_plaintext_client_against_the_gate_fails_within_the_bound(tmp_path, monkeypatch,
                                                                  bounded_wait):
    monkeypatch.delenv(BROKER_TLS_ENV, raising=False)
    with EmbeddedServices(isolated=True) as gated:
        err, elapsed = _start_failure(tmp_path, gated, "probe-plain-client")
    assert isinstance(err, ListenerMismatch), repr(err)
    line = str(err)
    assert "\n" not in line
    assert "it speaks TLS" in line and BROKER_TLS_ENV in line, line
    assert elapsed < BOUND + SLACK
