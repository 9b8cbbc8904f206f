"""A Redis that knows only the given ACL users (and an administrator), beside an embedded broker:
the stream run with each role logged in as its own Redis user (tests/test_security_acl.py,
tests/test_identity_guard.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pipeline.security import Security
from pipeline.stream.local.embedded import EmbeddedBroker, EmbeddedRedis


@contextlib.contextmanager
def acl_redis_and_broker(directory: Path, rules: list[str]
                         ) -> Iterator[tuple[EmbeddedRedis, EmbeddedBroker]]:
    """``rules``: ACL user lines without their leading ``user`` (as the generated ACL file holds
    them); the administrator is ``admin`` / ``pw-admin``."""
    server = EmbeddedRedis(directory, username="admin", password="pw-admin", acl_users=rules).start()
    try:
        broker = EmbeddedBroker().start()
        try:
            yield server, broker
        finally:
            broker.stop()
    finally:
        server.stop()


def redis_login(role: str) -> Security:
    """The Redis login of ``role``'s ACL user, its password read from ``PW_<role>``."""
    return Security.model_validate(
        {"redis": {"username": f"dpstream-{role}", "password": {"env": f"PW_{role}"}}})
