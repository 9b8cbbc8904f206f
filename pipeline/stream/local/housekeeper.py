"""``dpstream up``'s housekeeping rounds in a thread of their own, beside its supervision loop.

A round (the durable log's retention, the lag watch's probe of the broker) talks to the broker, its
object store and Redis, and waits as long as they take to answer: up to a client's request timeout
(30 s for the probe's ListOffsets) when one of them was killed or hangs. Run inside the supervision
loop, such a round held up the check that notices a dead child; it is that child the round waits
for. Here the loop only collects, between its checks, the lines the finished rounds left.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["Housekeeper"]


class Housekeeper:
    """Runs ``round()`` every ``interval`` seconds (after the previous one ended) in a daemon thread.

    A daemon thread: a round waiting on a dead service never holds up the exit of ``up``. The owner
    keeps every effect outside this process's memory (files, the endpoints record) to itself.
    """

    def __init__(self, round: Callable[[], list[str]], interval: float):
        self._round = round
        self._interval = interval
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpstream-housekeeping", daemon=True)

    def start(self) -> Housekeeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                lines = self._round()
            except Exception as err:  # noqa: BLE001 - a round must never end the housekeeping
                lines = [f"housekeeping round failed: {err!r}; retried in {self._interval:g} s"]
            for line in lines:
                self._lines.put(line)
            self._stopping.wait(self._interval)

    def lines(self) -> list[str]:
        """What the rounds finished since the last call had to say, in order; never waits."""
        out = []
        while True:
            try:
                out.append(self._lines.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        """No round starts after this; one under way finishes (or fails) on its own."""
        self._stopping.set()
