"""Reading report files (CSV, JSONL) for ``dpstream produce``: the whole file is checked before anything is sent.

Every report of the file goes through the workers' own parser (:class:`ReportParser`, the same
rules as ingest), so a report the workers would dead-letter stops the send instead: a bad JSON line,
a non-integer or out-of-range step, a header naming an undeclared attribute, an unknown user, a
value outside its domain, or the same (user, step) twice. The error names the file, the line and the
column (CSV: the column number and header; JSONL: the character column where known). Nothing is
sent unless every line is good, so a partial send never happens.

Bounded memory: :func:`check_report_file` reads the file in chunks of :data:`CHUNK` reports and
keeps, besides one chunk, a byte per roster row for each step seen (the duplicate check) and a
count and first line per step. Sending reads the file a second time, a chunk at a time
(:meth:`ReportFile.chunks`), so neither pass holds the file's reports.
"""

from __future__ import annotations

import csv
import difflib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import orjson

from pipeline.small_ints import distinct, value_counts
from pipeline.stream.ingest.reports import ReportParser

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = [
    "ReportFileError",
    "ReportFile",
    "FileReports",
    "check_report_file",
    "read_report_file",
    "first_rejection",
    "CHUNK",
]

CHUNK = 10_000  # reports per chunk: what either pass over a file holds at a time


class ReportFileError(ValueError):
    """A report file that cannot be sent as a whole; the message names file, line and column."""

    def __init__(self, path, line: int | None, column: str | int | None, message: str):
        where = (
            str(path)
            + (f":{line}" if line is not None else "")
            + (f": column {column}" if column is not None else "")
        )
        super().__init__(f"{where}: {message}")


@dataclass
class FileReports:
    """The file's reports (single-report objects) and, per report, its line number in the file."""

    reports: list[dict]
    lines: list[int]

    def steps(self) -> set[int]:
        return {int(r["step"]) for r in self.reports}

    def only_step(self, step: int) -> FileReports:
        keep = [i for i, r in enumerate(self.reports) if r["step"] == step]
        return FileReports([self.reports[i] for i in keep], [self.lines[i] for i in keep])


@dataclass(frozen=True)
class ReportFile:
    """A checked report file: what it holds per step (count, first line), never its reports, which
    :meth:`chunks` reads again from the file. ``step`` set: only that step's reports are read."""

    path: Path
    deployment: Deployment
    counts: dict[int, int]  # step -> reports in the file
    first_lines: dict[int, int]  # step -> line of its first report
    stamp: tuple[int, int]  # (size, mtime_ns) when checked: a file changed since is refused
    step: int | None = None

    def __len__(self) -> int:
        return sum(self.counts.values())

    def steps(self) -> set[int]:
        return set(self.counts)

    def only_step(self, step: int) -> ReportFile:
        return replace(
            self,
            counts={step: self.counts[step]} if step in self.counts else {},
            first_lines={step: self.first_lines[step]} if step in self.first_lines else {},
            step=step,
        )

    def chunks(self, size: int = CHUNK) -> Iterator[tuple[list[dict], list[int]]]:
        """(reports, lines) a chunk at a time, in file order; ReportFileError if the file changed since checked."""
        if _stamp(self.path) != self.stamp:
            raise ReportFileError(
                self.path, None, None, "the file changed after it was checked; nothing more sent"
            )
        for recs in _chunks(_records(self.path, self.deployment), size):
            keep = [
                (no, rep) for no, rep, _ in recs if self.step is None or rep["step"] == self.step
            ]
            if keep:
                yield [rep for _, rep in keep], [no for no, _ in keep]

    def reports(self) -> Iterator[dict]:
        for reports, _ in self.chunks():
            yield from reports

    def line_of(self, index: int) -> int | None:
        """Line of the ``index``-th report read by :meth:`chunks` (for error messages: reads the file again)."""
        for _reports, lines in self.chunks():
            if index < len(lines):
                return lines[index]
            index -= len(lines)
        return None


def check_report_file(
    path: str | Path, deployment: Deployment, roster, chunk: int = CHUNK
) -> ReportFile:
    """Check a whole ``*.csv`` or ``*.jsonl`` report file a chunk at a time; raises :class:`ReportFileError`
    at the first bad line. Memory: one chunk, plus a byte per roster row for each step in the file."""
    path = Path(path)
    csv_hints = path.suffix.lower() == ".csv"
    parser = ReportParser(roster, deployment.attributes, deployment.horizon, csv_hints=csv_hints)
    records = _records(path, deployment)
    stamp = _stamp(path)
    seen: dict[int, np.ndarray] = {}  # step -> which roster rows already have a report at that step
    counts: dict[int, int] = {}
    first_lines: dict[int, int] = {}
    for recs in _chunks(records, chunk):
        # msgspec, not orjson: orjson's bytes keep a ~4 kB buffer each (40 MB a chunk, measured)
        parsed = parser.parse([msgspec.json.encode(rep) for _, rep, _ in recs])
        rejected = min((rej.message for rej in parsed.rejections), default=len(recs))
        rejection = next((rej for rej in parsed.rejections if rej.message == rejected), None)
        rows, steps, message = (
            parsed.rows,
            parsed.steps,
            parsed.message,
        )  # accepted reports, in file order
        again = _repeats(seen, rows, steps, roster.n)
        repeated = int(message[again].min()) if again.any() else len(recs)
        if repeated < rejected:
            no, rep, _ = recs[repeated]
            first = _first_line(path, deployment, rep["user"], rep["step"])
            raise ReportFileError(
                path,
                no,
                _column(recs[repeated], "user"),
                f"a second report for user "
                f"{rep['user']!r} at step {rep['step']} (first on line {first}); the workers "
                "would dead-letter it as duplicate",
            )
        if rejection is not None:
            rec = recs[rejected]
            blamed = _blamed_field(rejection, rec[1])
            raise ReportFileError(
                path,
                rec[0],
                _column(rec, blamed) if blamed else None,
                f"{rejection.reason}: {rejection.detail}",
            )
        for step, rows_at in _by_step(rows, steps):
            seen.setdefault(step, np.zeros(roster.n, dtype=bool))[rows_at] = True
        for i in np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if steps.size else ():
            step = int(steps[i])
            first_lines.setdefault(step, recs[int(message[i])][0])
        for step, _, n in zip(*value_counts(steps)):
            counts[int(step)] = counts.get(int(step), 0) + int(n)
    return ReportFile(path, deployment, counts, first_lines, stamp)


def read_report_file(path: str | Path, deployment: Deployment, roster) -> FileReports:
    """Check a report file and return all its reports in memory (small files, library use; ``dpstream
    produce`` sends from :func:`check_report_file` instead); raises :class:`ReportFileError`."""
    checked = check_report_file(path, deployment, roster)
    reports, lines = [], []
    for chunk_reports, chunk_lines in checked.chunks():
        reports += chunk_reports
        lines += chunk_lines
    return FileReports(reports, lines)


def _repeats(
    seen: dict[int, np.ndarray], rows: np.ndarray, steps: np.ndarray, n: int
) -> np.ndarray:
    """Mask of the reports whose (row, step) came earlier: in an earlier chunk, or earlier in this one."""
    again = np.zeros(rows.size, dtype=bool)
    for step, at in _by_step(rows, steps, positions=True):
        before = seen.get(step)
        if before is not None:
            again[at] |= before[rows[at]]
        order = at[
            np.argsort(rows[at], kind="stable")
        ]  # equal rows stay in file order: the later ones repeat
        again[order[1:][rows[order[1:]] == rows[order[:-1]]]] = True
    return again


def _by_step(rows: np.ndarray, steps: np.ndarray, positions: bool = False):
    """(step, rows at that step) per step, or (step, positions of those reports) with ``positions``."""
    for step in distinct(steps):
        at = np.flatnonzero(steps == step)
        yield int(step), (at if positions else rows[at])


def _first_line(path: Path, deployment: Deployment, user, step) -> int | None:
    """Line of the first report of (user, step): read again, for the error message of a repeat."""
    return next(
        (
            no
            for no, rep, _ in _records(path, deployment)
            if rep["user"] == user and rep["step"] == step
        ),
        None,
    )


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _chunks(records: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(records, size)):
        yield chunk


def _records(path: str | Path, deployment: Deployment) -> Iterator[tuple[int, dict, object]]:
    """(line, report, where) per report of the file, read lazily; ``where`` locates the columns (CSV: column
    per field; JSONL: the line's bytes, searched only for an error). The header is checked on the first read."""
    path = Path(path)
    if not path.exists():
        raise ReportFileError(path, None, None, "no such file")
    reader = _read_csv if path.suffix.lower() == ".csv" else _read_jsonl
    records = reader(path, deployment)
    first = next(records, None)  # a generator: read the header (CSV) now, so its errors come first
    if first is None:
        return iter(())
    return _prepend(first, records)


def _prepend(first, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _column(record: tuple, name: str) -> str | int | None:
    """Column of field ``name`` in a record of :func:`_records`."""
    _, report, where = record
    if isinstance(where, dict):
        return where.get(name)
    if name not in _keys(report):
        return None
    return where.find(orjson.dumps(name)) + 1 or None


def _read_jsonl(path: Path, deployment: Deployment) -> Iterator[tuple[int, dict, bytes]]:
    with path.open("rb") as fh:
        for no, raw in enumerate(fh, 1):
            if no == 1 and raw.startswith(
                b"\xef\xbb\xbf"
            ):  # a byte-order mark (UTF-8 text from Windows tools)
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as err:
                col = re.search(r"column (\d+)", str(err))
                raise ReportFileError(
                    path, no, int(col.group(1)) if col else None, f"not JSON ({err})"
                ) from None
            if type(obj) is not dict or "reports" in obj or "columns" in obj:
                raise ReportFileError(
                    path,
                    no,
                    1,
                    'each line must be one report {"user": ..., "step": ..., "values": {...}}',
                )
            yield no, obj, raw


def _keys(obj: dict) -> list[str]:
    values = obj.get("values")
    return [k for k in obj if isinstance(k, str)] + (
        list(values) if isinstance(values, dict) else []
    )


def _read_csv(path: Path, deployment: Deployment) -> Iterator[tuple[int, dict, dict]]:
    with path.open(
        newline="", encoding="utf-8-sig"
    ) as fh:  # a byte-order mark (Excel's "CSV UTF-8") is dropped
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise ReportFileError(
                path, 1, None, "empty file: the header must be user,step,<attribute>..."
            )
        known = ["user", "step", *deployment.attributes]
        for j, name in enumerate(header, 1):
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                raise ReportFileError(
                    path,
                    1,
                    f"{j} ({name!r})",
                    f"unknown column {name!r}"
                    + (f"; did you mean {hint[0]!r}?" if hint else "")
                    + f" (columns are user, step and the declared attributes {list(deployment.attributes)})",
                )
            if header.count(name) > 1:
                raise ReportFileError(path, 1, f"{j} ({name!r})", f"column {name!r} appears twice")
        for needed in ("user", "step"):
            if needed not in header:
                raise ReportFileError(path, 1, None, f"the header has no {needed!r} column")
        where = {name: f"{j} ({name!r})" for j, name in enumerate(header, 1)}
        for rec in reader:
            no = reader.line_num
            if not rec:
                continue
            if len(rec) != len(header):
                raise ReportFileError(
                    path, no, None, f"{len(rec)} fields, the header has {len(header)}"
                )
            row = dict(zip(header, rec))
            try:
                step = int(row["step"])
            except ValueError:
                raise ReportFileError(
                    path, no, where["step"], f"step {row['step']!r} is not an integer"
                ) from None
            values = {
                a: deployment.attributes[a].csv_value(v)
                for a, v in row.items()
                if a not in ("user", "step") and v != ""
            }
            yield no, {"user": row["user"], "step": step, "values": values}, where


def first_rejection(
    reports: list[dict], deployment: Deployment, roster
) -> tuple[int, str, str, object] | None:
    """(index, reason, detail, rejection) of the first report the workers would reject (their own parser's
    stateless checks), or of a repeated (user, step); None when every report is good."""
    parser = ReportParser(roster, deployment.attributes, deployment.horizon)
    parsed = parser.parse([orjson.dumps(r) for r in reports])
    if parsed.rejections:
        rej = min(parsed.rejections, key=lambda r: r.message)
        return rej.message, rej.reason, rej.detail, rej
    seen: dict[tuple[str, int], int] = {}
    for i, rep in enumerate(reports):
        key = (rep["user"], rep["step"])
        if key in seen:
            return (
                i,
                "duplicate",
                (
                    f"a second report for user {key[0]!r} at step {key[1]} (first: report "
                    f"{seen[key]}); the workers would dead-letter it as duplicate"
                ),
                None,
            )
        seen[key] = i
    return None


def _blamed_field(rejection, report: dict) -> str | None:
    if rejection.reason == "unknown_user":
        return "user"
    if rejection.reason == "future_step" or "step" in rejection.detail:
        return "step"
    names = re.findall(r"'([^']*)'", rejection.detail)
    for name in reversed(names):
        if name in (report.get("values") or {}) or name in report:
            return name
    return None
