"""`make test` hands the longest test files out first (tests/support/file_order.py): the durations
one run records order the next; files without a record go first when they start processes."""

from __future__ import annotations

from types import SimpleNamespace

from support.file_order import CACHE_KEY, FileDurations, order_items


class Cache(dict):
    def set(self, key, value):
        self[key] = value


def _items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def _starts(item) -> bool:
    return "proc" in item.nodeid


def test_the_longest_recorded_files_go_first_and_keep_their_tests_in_order():
    items = _items("a.py::t1", "a.py::t2", "b_proc.py::t1", "c.py::t1", "c.py::t2", "new_proc.py::t",
                   "new.py::t")
    cache = Cache({CACHE_KEY: {"a.py": 5.0, "b_proc.py": 40.0, "c.py": 90.0}})
    order_items(items, cache, _starts)
    assert [i.nodeid for i in items] == ["new_proc.py::t", "c.py::t1", "c.py::t2", "b_proc.py::t1",
                                         "a.py::t1", "a.py::t2", "new.py::t"]


def test_without_a_record_the_files_that_start_processes_go_first():
    items = _items("a.py::t", "b_proc.py::t1", "b_proc.py::t2", "c.py::t")
    order_items(items, None, _starts)
    assert [i.nodeid for i in items] == ["b_proc.py::t1", "b_proc.py::t2", "a.py::t", "c.py::t"]
    order_items(items, Cache(), _starts)
    assert [i.nodeid for i in items][:2] == ["b_proc.py::t1", "b_proc.py::t2"]


def test_a_run_adds_its_files_to_the_record():
    cache = Cache({CACHE_KEY: {"a.py": 5.0, "b.py": 7.0}})
    durations = FileDurations()
    for nodeid, seconds in (("a.py::t1", 1.5), ("a.py::t1", 0.25), ("c.py::t", 3.0)):
        durations.add(SimpleNamespace(nodeid=nodeid, duration=seconds))
    durations.save(cache)
    assert cache[CACHE_KEY] == {"a.py": 1.75, "b.py": 7.0, "c.py": 3.0}
