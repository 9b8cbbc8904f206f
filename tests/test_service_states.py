"""A failed test's report names how its embedded broker ended and shows its log
(tests/support/service_states.py, added to failures by tests/conftest.py)."""

from __future__ import annotations

from pipeline.stream.local.embedded import EmbeddedServices
from support.service_states import service_states


def test_a_killed_broker_is_named_with_its_log():
    with EmbeddedServices() as services:
        alive = service_states(services)
        assert "broker" in alive and "alive (pid" in alive
        assert "tansu broker" in alive  # the log's first line, kept in the temporary directory
        services.broker._proc.kill()
        services.broker._proc.wait()
        ended = service_states(services)
        assert "ended by SIGKILL" in ended
        assert "listening on: tcp://127.0.0.1:" in ended
