"""The end of a short command's process without the interpreter's teardown.

A command that imports the data and client libraries (numpy, pyarrow, kafka-python, redis,
pydantic) spends ~150-250 ms after its last line, at the interpreter's exit, tearing down those
modules and collecting their objects: ~12% of a small file's ``dpstream produce``
(docs/streaming.md, "A small file"). What that exit does with effects outside the process is done
here, in the same order: non-daemon threads are waited for (and the thread pools' exit hooks
run), the ``atexit`` functions run (logging's flush, ``weakref.finalize`` callbacks), and the
standard streams are flushed; then the process ends with ``os._exit``.

Only for commands that leave nothing to a teardown: a file object they write is closed by them,
not by its collection (``produce`` and ``status`` write no file: :data:`QUICK_COMMANDS`). Their
many short-lived objects are collected less often too (:data:`YOUNG_THRESHOLD`): of ~190
collections in a small file's ``produce``, ~40-70 ms, most run while modules are imported.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["QUICK_COMMANDS", "YOUNG_THRESHOLD", "is_quick", "leave"]

QUICK_COMMANDS = frozenset({"produce", "status"})
# allocations between collections of the youngest generation (CPython's default: 700)
YOUNG_THRESHOLD = 20_000


def is_quick(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a quick command: its first word that is not an option (an option's
    value taken for the command only loses the quick exit)."""
    return next((a for a in argv if not a.startswith("-")), None) in QUICK_COMMANDS


def collect_less() -> None:
    """Collect the youngest generation every :data:`YOUNG_THRESHOLD` allocations, not 700."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


def leave(code: int) -> NoReturn:
    """End the process with ``code`` as the interpreter's exit would, less its teardown."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None:  # not CPython's threading: the usual exit
        sys.exit(code)
    shutdown()  # non-daemon threads joined, after the hooks that tell thread pools to stop
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
            pass
    os._exit(code)
