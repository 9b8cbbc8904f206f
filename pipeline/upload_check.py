"""The upload's check of a report file, one chunk of columns at a time, vectorised.

A report passes when the workers' parser would accept it (:mod:`pipeline.stream.ingest.reports`):
its step is in ``1..horizon``, its user is enrolled, every value is in its attribute's domain and
at least one attribute is reported; and when no earlier report of the file has its (user, step).
Repeats are found with a bitmap per step present in the file (a byte per roster row: 1 MB per
10^6 users and step), so the check's memory is one chunk plus those bitmaps, whatever the file's
length. A chunk whose reports are all enrolled, in the horizon and not repeated (the usual case)
is marked in one pass: its rows looked up in the bitmap, and checked for a repeat among themselves
(ascending rows cannot repeat; else the bitmap's marks are counted before and after marking them,
or the rows sorted); only a chunk with a bad report goes through the exact pass that names the
first one. :class:`FileCheck` keeps, per step, the reports counted and the position of the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.attributes import OUT_OF_DOMAIN
from pipeline.small_ints import value_counts
from pipeline.stream.ingest.report_files import _by_step, _repeats
from pipeline.upload_columns import Columns
from pipeline.upload_rows import UserRows

__all__ = ["FileCheck", "Problem", "stateless_problem"]


@dataclass(frozen=True)
class Problem:
    """The first report of a chunk the workers would reject, and why."""

    position: int  # in the file, 0-based
    reason: str  # step, out_of_domain, empty, unknown_user, duplicate
    attribute: str | None = None


def stateless_problem(chunk: Columns, horizon: int) -> Problem | None:
    """The first report with a step outside the horizon, a value outside its domain or no value."""
    if _all_pass(chunk, horizon):  # the usual chunk: a few reductions, no mask per rule
        return None
    steps = chunk.steps
    bad = {"step": (steps < 1) | (steps > horizon)}
    present, outside = np.zeros(steps.size, dtype=bool), np.zeros(steps.size, dtype=bool)
    for name, c in chunk.codes.items():
        bad[f"out_of_domain:{name}"] = c == OUT_OF_DOMAIN
        present |= c >= 0
        outside |= c == OUT_OF_DOMAIN
    bad["empty"] = ~present & ~outside
    return _first_of(chunk.start, bad)


def _all_pass(chunk: Columns, horizon: int) -> bool:
    """Whether no report of the chunk can break a stateless rule: every step in the horizon, no
    code ``OUT_OF_DOMAIN`` (the lowest code) and one attribute reported by every report. False
    does not mean a report breaks one (several attributes may share the reports' values)."""
    if not len(chunk):
        return True
    low, high = chunk.step_range
    if low < 1 or high > horizon:
        return False
    lowest = [chunk.code_range(name)[0] for name in chunk.codes]
    return all(low > OUT_OF_DOMAIN for low in lowest) and any(low >= 0 for low in lowest)


def _marked_once(rows: np.ndarray, seen: np.ndarray, before: int) -> bool:
    """Mark ``rows`` (none of which is marked in ``seen`` yet) in ``seen`` when none occurs twice
    among them; False, ``seen`` unchanged, when one does. Rows ascending cannot repeat; else,
    when the bitmap is small beside the rows (fewer than 256 roster rows a report), the rows
    are marked and the marks counted after (a repeat marks fewer rows than it has; a fresh
    bitmap for them cost a page fault per 4 kB and its own scatter), sorted otherwise.
    ``before``: the rows marked in ``seen`` (the reports counted at its step)."""
    if rows.size >= 2 and not (rows[1:] > rows[:-1]).all():
        if seen.size <= 256 * rows.size:
            seen[rows] = True
            if int(np.count_nonzero(seen)) - before == rows.size:
                return True
            seen[rows] = False  # they were all unmarked before
            return False
        ordered = np.sort(rows)
        if (ordered[1:] == ordered[:-1]).any():
            return False
    seen[rows] = True
    return True


def _first_of(start: int, bad: dict[str, np.ndarray]) -> Problem | None:
    found = [(int(np.argmax(mask)), name) for name, mask in bad.items() if mask.any()]
    if not found:
        return None
    at, name = min(found)
    reason, _, attribute = name.partition(":")
    return Problem(start + at, reason, attribute or None)


@dataclass
class FileCheck:
    """The check of one file, fed its chunks in file order."""

    horizon: int
    users: int  # roster size
    rows: UserRows
    counts: dict[int, int] = field(default_factory=dict)  # step -> reports
    first_rows: dict[int, int] = field(default_factory=dict)  # step -> position of its first
    _seen: dict[int, np.ndarray] = field(default_factory=dict)  # step -> rows with a report

    @property
    def reports(self) -> int:
        return sum(self.counts.values())

    @property
    def present(self) -> dict[int, np.ndarray]:
        """step -> the roster rows with a report in the file (a bool per row)."""
        return self._seen

    def problem(self, chunk: Columns) -> Problem | None:
        """The chunk's first bad report (None: all pass, and they are counted)."""
        stateless = stateless_problem(chunk, self.horizon)
        rows = self.rows.rows(chunk.users, chunk.user_words)
        steps = chunk.steps
        values, first, counts = value_counts(steps, chunk.step_range)
        if stateless is None and not (rows < 0).any() and self._marked(rows, steps, values):
            self._count(chunk.start, values, first, counts)
            return None
        # a bad report: found by the exact pass below (the bitmaps are as before the chunk)
        fine = np.flatnonzero((rows >= 0) & (steps >= 1) & (steps <= self.horizon))
        again = np.zeros(steps.size, dtype=bool)
        again[fine] = _repeats(self._seen, rows[fine], steps[fine], self.users)
        stateful = _first_of(chunk.start, {"unknown_user": rows < 0, "duplicate": again})
        found = [p for p in (stateless, stateful) if p is not None]
        if found:
            return min(found, key=lambda p: p.position)
        for step, rows_at in _by_step(rows, steps):
            self._seen.setdefault(step, np.zeros(self.users, dtype=bool))[rows_at] = True
        self._count(chunk.start, values, first, counts)
        return None

    def _count(self, start: int, values, first, counts) -> None:
        for step, at, count in zip(values.tolist(), first.tolist(), counts.tolist()):
            self.counts[step] = self.counts.get(step, 0) + count
            self.first_rows.setdefault(step, start + at)

    def _marked(self, rows: np.ndarray, steps: np.ndarray, values: np.ndarray) -> bool:
        """Mark the chunk's (row, step) pairs in the bitmaps when none repeats (every row
        enrolled, every step in the horizon); False, bitmaps unchanged, when one does."""
        if values.size == 1:
            groups = [(int(values[0]), rows)]
        else:
            groups = [(step, rows[steps == step]) for step in values.tolist()]
        marked: list[tuple[int, np.ndarray]] = []
        for step, rows_at in groups:
            seen = self._seen.get(step)
            if seen is None:
                seen = self._seen[step] = np.zeros(self.users, dtype=bool)
            # the bitmap marks each report counted at its step once: its marks are that count
            # (not counted again: a pass over 1 MB per 10^6 users and chunk, ~0.3 ms per 10^6)
            before = self.counts.get(step, 0)
            if seen[rows_at].any() or not _marked_once(rows_at, seen, before):
                for step_done, done in marked:
                    self._seen[step_done][done] = False
                return False
            marked.append((step, rows_at))
        return True
