"""A per-request trace of the embedded object store: where its time goes, request by request.

Set ``DPSTREAM_OBJECT_STORE_TRACE=<file>`` in the object store's environment (``dpstream up`` passes
its environment on) and every request it answers is one tab-separated line in that file:

    start  end  method  key-or-query  status  phase=seconds ...

``start`` is when the request line had been read (``time.monotonic()``), ``end`` when the response
was flushed; the phases are the parts of a write (``write``: the temporary file, its body, its fsync
and its link or rename into place; ``fsync``: the file's fsync alone; ``dirsync``: the folders';
``journal``: the journal record appended and flushed; ``cpu``: the CPU time of the request's thread,
the rest of its time is waiting for the disk or for a core). The
gaps between one connection's requests are the broker's (and the network's) time, not the store's:
``jobs/bench/profile_durable_produce.py`` sets them side by side. Off by default: no cost then.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["TRACE_ENV", "RequestTrace", "trace_from_env"]

TRACE_ENV = "DPSTREAM_OBJECT_STORE_TRACE"


class RequestTrace:
    """Appends one line per request to a file, from any thread; phases are collected per thread."""

    def __init__(self, path: str):
        # line-buffered: a killed store keeps its lines
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self._lock = threading.Lock()
        self._local = threading.local()

    def begin(self) -> None:
        self._local.start, self._local.phases = time.monotonic(), []
        self._local.cpu = time.thread_time()

    def phase(self, name: str, seconds: float) -> None:
        phases = getattr(self._local, "phases", None)
        if phases is not None:
            phases.append(f"{name}={seconds:.6f}")

    def end(self, method: str, target: str, status: int) -> None:
        start = getattr(self._local, "start", None)
        if start is None:
            return
        cpu = f"cpu={time.thread_time() - self._local.cpu:.6f}"
        line = "\t".join(
            [
                f"{start:.6f}",
                f"{time.monotonic():.6f}",
                method,
                target,
                str(status),
                *self._local.phases,
                cpu,
            ]
        )
        self._local.start = self._local.phases = None
        with self._lock:
            self._file.write(line + "\n")


def trace_from_env() -> RequestTrace | None:
    path = os.environ.get(TRACE_ENV)
    return RequestTrace(path) if path else None
