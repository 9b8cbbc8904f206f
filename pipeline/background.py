"""A value made in a daemon thread while the caller goes on (an interrupted process does not wait
for it): the verdict's broker probe, the upload's dead-letter mark."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["in_daemon_thread"]


def in_daemon_thread(make: Callable[[], object], name: str) -> Future:
    """``make()`` in a daemon thread named ``name``; its value or its exception in the future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(make())
        except BaseException as err:  # noqa: BLE001 - raised by future.result()
            future.set_exception(err)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
