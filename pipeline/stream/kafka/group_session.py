"""The jobs' consumer-group session timeout: how long a member that stopped heartbeating (a killed
job) keeps its partitions before the group gives them to another member.

It also sets how long a join takes on the embedded broker (Tansu), which holds each join for half
the session timeout (~5 s at the default 10 s; docs/streaming.md). ``DPSTREAM_GROUP_SESSION_TIMEOUT_MS``
changes it: a shorter one hands a killed job's partitions on sooner and joins faster, but evicts a
member whose heartbeats (every second, from the job's event loop) stall for longer than it, which a
loaded machine can cause. The test suite shortens it where what a test checks does not depend on it.
"""

from __future__ import annotations

import os

__all__ = ["HEARTBEAT_INTERVAL_MS", "SESSION_TIMEOUT_ENV", "session_timeout_ms"]

SESSION_TIMEOUT_ENV = "DPSTREAM_GROUP_SESSION_TIMEOUT_MS"
SESSION_TIMEOUT_MS = 10_000
HEARTBEAT_INTERVAL_MS = 1_000
MIN_SESSION_TIMEOUT_MS = 3 * HEARTBEAT_INTERVAL_MS  # a late heartbeat or two must not evict


def session_timeout_ms() -> int:
    """``DPSTREAM_GROUP_SESSION_TIMEOUT_MS`` (milliseconds, at least three heartbeat intervals), else
    10 000; a value that is not such a number is refused with a ValueError naming the variable."""
    raw = os.environ.get(SESSION_TIMEOUT_ENV, "").strip()
    if not raw:
        return SESSION_TIMEOUT_MS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{SESSION_TIMEOUT_ENV} must be a whole number of milliseconds, got {raw!r}"
        ) from None
    if value < MIN_SESSION_TIMEOUT_MS:
        raise ValueError(
            f"{SESSION_TIMEOUT_ENV} must be at least {MIN_SESSION_TIMEOUT_MS} ms (three heartbeat "
            f"intervals of {HEARTBEAT_INTERVAL_MS} ms), got {value}"
        )
    return value
