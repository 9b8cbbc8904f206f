"""The jobs' consumer-group session timeout: 10 s unless DPSTREAM_GROUP_SESSION_TIMEOUT_MS says
otherwise, a bad value refused naming the variable, and the value given is the one the jobs'
consumer sends when it joins."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.stream.kafka.bulk_consumer import BulkConsumer
from pipeline.stream.kafka.group_session import SESSION_TIMEOUT_ENV, session_timeout_ms


def test_the_default_is_ten_seconds(monkeypatch):
    monkeypatch.delenv(SESSION_TIMEOUT_ENV, raising=False)
    assert session_timeout_ms() == 10_000


@pytest.mark.parametrize("raw, said", [
    ("5s", "must be a whole number of milliseconds, got '5s'"),
    ("2999", "must be at least 3000 ms (three heartbeat intervals of 1000 ms), got 2999"),
    ("-1", "must be at least 3000 ms"),
])
def test_a_bad_value_is_refused_naming_the_variable(monkeypatch, raw, said):
    monkeypatch.setenv(SESSION_TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=f"^{SESSION_TIMEOUT_ENV} ") as refused:
        session_timeout_ms()
    assert said in str(refused.value)


def test_the_jobs_consumer_joins_with_the_given_session_timeout(monkeypatch):
    monkeypatch.setenv(SESSION_TIMEOUT_ENV, "4500")

    async def nothing(_):
        return {}

    async def sent() -> int:  # built, never started: no broker needed
        consumer = BulkConsumer("127.0.0.1:9", "group", ["topic"], on_assign=nothing,
                                on_revoke=nothing)
        return consumer.consumer._session_timeout_ms

    assert asyncio.run(sent()) == 4500
