"""An iterator read one item ahead in a thread, so reading the next item overlaps using this one.

The upload's check reads a file a chunk at a time (pyarrow decodes Parquet, CSV and JSON with the
GIL released) while the previous chunk is checked and built into messages (numpy and Arrow
kernels, which release it too): on two cores the two overlap. The next item is read only once the
consumer has taken the last: at most one item besides the one in use, so memory is one chunk more
than without it. An exception raised while reading is
raised to the consumer, at the item where it happened.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")
_END = object()


def read_ahead(items: Iterable[T]) -> Iterator[T]:
    """``items``, produced by a thread one item ahead of the consumer. Closing the generator
    (a consumer that stops early) stops the thread after the item it is reading."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                ready.put((item, None))
                ready.join()  # taken: read the next while the consumer uses this one
            ready.put((_END, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            ready.put((_END, err))

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, err = ready.get()
            ready.task_done()
            if err is not None:
                raise err
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a put or join waiting on us, then let it see ``stop``
            try:
                ready.get(timeout=0.05)
                ready.task_done()
            except queue.Empty:
                pass
        thread.join()
