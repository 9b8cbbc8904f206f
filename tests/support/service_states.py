"""What the embedded services of a failed test were doing: each process alive or how it ended, and
the tail of the broker's log (a broker that stopped listening mid-test otherwise leaves only the
clients' ``ECONNREFUSED``). Added to the failure's report by ``tests/conftest.py``."""

from __future__ import annotations

import signal
from pathlib import Path

from pipeline.stream.local.embedded import EmbeddedServices

TAIL_LINES = 40


def _state(process) -> str:
    if process is None or process.pid is None:
        return "not started (or stopped)"
    code = process.returncode
    if code is None:
        return f"alive (pid {process.pid})"
    if code < 0:
        return f"ended by {signal.Signals(-code).name} (pid {process.pid})"
    return f"exited with code {code} (pid {process.pid})"


def _tail(path: Path | None) -> str:
    if path is None:
        return "(no log)"
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as err:
        return f"(log unreadable: {err})"
    return "\n".join(lines[-TAIL_LINES:]) or "(log empty)"


def service_states(services: EmbeddedServices) -> str:
    """The services' states and the broker log's last lines, as text."""
    lines = [f"broker {services.broker.bootstrap}: {_state(services.broker)}"]
    if services.storage is not None:
        lines.append(f"object store: {_state(services.storage)}")
    if services.gate is not None:
        lines.append(f"gate: {_state(services.gate)}")
    redis = getattr(services.redis, "_client", None)
    pid = getattr(redis, "pid", None) if redis is not None else None
    lines.append(f"redis on port {services.redis.port}: server pid {pid}")
    lines.append(f"--- last {TAIL_LINES} lines of {services.broker.log_path} ---")
    lines.append(_tail(services.broker.log_path))
    return "\n".join(lines)
