"""Shorter consumer-group sessions for the test files whose checks do not depend on their length.

The jobs' session timeout (pipeline/stream/kafka/group_session.py, 10 s by default) sets how long
every join takes on the embedded broker (half of it) and how long a killed job's successor waits for
its partitions (all of it). A file that uses the fixture (``pytestmark =
pytest.mark.usefixtures("short_group_sessions")``; tests/conftest.py imports it) runs its jobs
with 5 s sessions: joins of ~3 s instead of ~5 s. A test there that counts on a killed job's partitions
staying unowned sets the default back itself.
"""

from __future__ import annotations

import pytest

from pipeline.stream.kafka.group_session import SESSION_TIMEOUT_ENV

SHORT_SESSION_TIMEOUT_MS = 5_000  # four missed heartbeats' margin on a loaded machine


@pytest.fixture(scope="module")
def short_group_sessions():
    """For the module's tests and its module fixtures (a cluster started once): every job they
    start inherits the variable."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SESSION_TIMEOUT_ENV, str(SHORT_SESSION_TIMEOUT_MS))
        yield
