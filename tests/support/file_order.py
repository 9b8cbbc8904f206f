"""The order in which `make test` hands test files to its xdist processes.

Each process takes the next file when it is done with one (``--dist loadfile``), so the suite ends
when the last process finishes; it ends soonest when the longest files go first (longest
processing time first) and the short ones fill the gaps at the end. Each run records how long every
file took (setup, call and teardown of its tests) in pytest's cache (``.pytest_cache``), and the
next run orders by that; a file not yet recorded goes first when it starts real processes, last
otherwise. Without a record (a clean clone) the files that start processes go first."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

CACHE_KEY = "dpstream/file_seconds"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FileDurations:
    """Seconds per test file of this run, merged into the cached record at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.recording = False

    def add(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def save(self, cache) -> None:
        if cache is None or not self.seconds:
            return
        record = dict(cache.get(CACHE_KEY, {}))
        record.update({name: round(s, 2) for name, s in self.seconds.items()})
        cache.set(CACHE_KEY, record)


def order_items(items: list, cache, starts_processes: Callable[[object], bool]) -> None:
    """Sort ``items`` in place, a file's tests kept together and in their order."""
    record: dict[str, float] = cache.get(CACHE_KEY, {}) if cache is not None else {}
    if not record:
        items.sort(key=lambda item: not starts_processes(item))
        return
    longest = max(record.values()) + 1.0

    def seconds(item) -> float:
        known = record.get(file_of(item.nodeid))
        if known is not None:
            return known
        return longest if starts_processes(item) else 0.0

    items.sort(key=lambda item: -seconds(item))
