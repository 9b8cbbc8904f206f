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
