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
    taken = threading.Semaphore(0)  # released once the consumer has taken an item
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                ready.put((item, None))
                taken.acquire()  # taken: read the next while the consumer uses this one
            ready.put((_END, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            ready.put((_END, err))

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, err = ready.get()
            taken.release()
            if err is not None:
                raise err
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            # unblock the thread waiting for its item to be taken (also when Ctrl-C came between
            # the consumer's get and its release: a queue's task_done count would then stay
            # owed and its join wait forever) or to put one, then let it see ``stop``; a
            # release more than it waits for is harmless
            taken.release()
            try:
                ready.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()
