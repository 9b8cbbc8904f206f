"""The upload's read-ahead: items in order, an error raised at the item where it happened, at
most one item read beyond the one in use, and a consumer that stops early stops the thread."""

from __future__ import annotations

import threading

import pytest

from pipeline.read_ahead import read_ahead


def test_items_in_order_and_an_error_where_it_happened():
    def items():
        yield from range(5)
        raise ValueError("bad chunk 5")

    got = []
    with pytest.raises(ValueError, match="bad chunk 5"):
        for item in read_ahead(items()):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]


def test_at_most_one_item_ahead_and_an_early_stop_ends_the_thread():
    produced = []

    def items():
        for i in range(100):
            produced.append(i)
            yield i

    reader = read_ahead(items())
    assert next(reader) == 0
    for _ in range(50):  # give the thread every chance to run ahead
        threading.Event().wait(0.002)
    assert len(produced) <= 2  # the one in use and the one read ahead
    reader.close()
    assert not [t for t in threading.enumerate() if t.name == "read-ahead"]
    assert len(produced) <= 3


def test_an_interrupt_between_taking_an_item_and_saying_so_still_ends_the_thread(monkeypatch):
    """Ctrl-C can land just after the consumer took an item from the queue and before it told the
    thread so: the thread must still end (it once waited forever on a queue's unfinished task,
    and ``dpstream produce`` hung instead of exiting 130)."""
    import queue
    import types

    import pipeline.read_ahead as module

    class InterruptedOnce(queue.Queue):
        fired = False

        def get(self, block=True, timeout=None):
            item = super().get(block, timeout)
            if timeout is None and not InterruptedOnce.fired:  # the consumer's take of item 0
                InterruptedOnce.fired = True
                raise KeyboardInterrupt
            return item

    monkeypatch.setattr(module, "queue", types.SimpleNamespace(Queue=InterruptedOnce, Empty=queue.Empty))
    outcome: list = []

    def consume():
        try:
            for _ in read_ahead(iter(range(100))):
                pass
        except KeyboardInterrupt:
            outcome.append("interrupted")

    consumer = threading.Thread(target=consume, daemon=True)  # a hang must not hold pytest
    consumer.start()
    consumer.join(timeout=10)
    assert not consumer.is_alive() and outcome == ["interrupted"]
    assert not [t for t in threading.enumerate() if t.name == "read-ahead"]
