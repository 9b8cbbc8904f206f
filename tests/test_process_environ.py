"""A process's initial environment, read right after its spawn.

`down` finds the leftovers of a killed `up` by a tag in their environment, and the control-plane
tests check which keys each stream process was given. Both read ``/proc/<pid>/environ``, which is
empty for a moment while the process is inside ``exec`` (``Popen`` returns once the exec has begun,
the kernel places the new environment a little later): a plain read right after a spawn was empty
in about 7% of spawns on the project's machine. ``process_environ`` reads again before it answers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.stream.local.leftovers import process_environ

SPAWNS = 150  # at ~7% empty plain reads, a plain read passes all of them with odds below 1e-4


def test_the_environment_of_a_just_spawned_process_is_never_read_as_empty():
    marker = b"DPSTREAM_TEST_ENVIRON=spawned"
    for _ in range(SPAWNS):
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(5)"],
            env={"DPSTREAM_TEST_ENVIRON": "spawned"},
            start_new_session=True,
        )
        try:
            assert marker in process_environ(proc.pid)
        finally:
            proc.kill()
            proc.wait()


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[0]


def test_a_zombie_is_gone_at_once(monkeypatch):
    """A zombie has no environment for good: it counts as gone (OSError), with no pause to reread."""
    from pipeline.stream.local import leftovers

    pauses: list[float] = []
    monkeypatch.setattr(leftovers.time, "sleep", pauses.append)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while _state(proc.pid) != b"Z":
            pass  # not yet exited (it exits at once; it stays a zombie until waited for)
        with pytest.raises(OSError):
            process_environ(proc.pid)
        assert pauses == []
    finally:
        proc.wait()
