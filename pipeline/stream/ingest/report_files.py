"""Reading report files (CSV, JSONL) for ``dpstream produce``: the whole file is checked before anything is sent.

Every report of the file goes through the workers' own parser (:class:`ReportParser`, the same
rules as ingest), so a report the workers would dead-letter stops the send instead: a bad JSON line,
a non-integer or out-of-range step, a header naming an undeclared attribute, an unknown user, a
value outside its domain, or the same (user, step) twice. The error names the file, the line and the
column (CSV: the column number and header; JSONL: the character column where known). Nothing is
sent unless every line is good, so a partial send never happens.

Memory does not grow with the file: :func:`scan_report_file` reads it a chunk of lines at a time
(checked as it goes; a repeated (user, step) is found with one bit per roster user and step), and
``dpstream produce`` reads the file twice — once to check it all, once to send it.
"""

from __future__ import annotations

import csv
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson

from pipeline.stream.ingest.reports import ReportParser

__all__ = ["ReportFileError", "FileReports", "read_report_file", "scan_report_file"]

CHUNK = 10_000  # reports checked (and sent) at a time


class ReportFileError(ValueError):
    """A report file that cannot be sent as a whole; the message names file, line and column."""

    def __init__(self, path, line: int | None, column: str | int | None, message: str):
        where = str(path) + (f":{line}" if line is not None else "") + (f": column {column}" if column is not None else "")
        super().__init__(f"{where}: {message}")


@dataclass
class FileReports:
    """The file's reports (single-report objects) and, per report, its line number in the file."""

    reports: list[dict]
    lines: list[int]

    def steps(self) -> set[int]:
        return {int(r["step"]) for r in self.reports}

    def only_step(self, step: int) -> "FileReports":
        keep = [i for i, r in enumerate(self.reports) if r["step"] == step]
        return FileReports([self.reports[i] for i in keep], [self.lines[i] for i in keep])


def read_report_file(path: str | Path, deployment, roster) -> FileReports:
    """Read and check a ``*.csv`` or ``*.jsonl`` report file whole; raises :class:`ReportFileError`."""
    found = FileReports([], [])
    for chunk in scan_report_file(path, deployment, roster):
        found.reports.extend(chunk.reports)
        found.lines.extend(chunk.lines)
    return found


def scan_report_file(path: str | Path, deployment, roster, chunk: int = CHUNK) -> Iterator[FileReports]:
    """The file's reports, ``chunk`` at a time, each chunk checked before it is yielded (raises
    :class:`ReportFileError` at the first bad line); memory is one chunk plus the seen-bitmap."""
    path = Path(path)
    if not path.exists():
        raise ReportFileError(path, None, None, "no such file")
    reader = _read_csv if path.suffix.lower() == ".csv" else _read_jsonl
    parser = ReportParser(roster, deployment.attributes, deployment.horizon)
    seen = np.zeros(roster.n * (deployment.horizon + 1), dtype=bool)  # (row, step) already in the file
    reports, lines, columns = [], [], []
    for rep, line, cols in reader(path, deployment):
        reports.append(rep)
        lines.append(line)
        columns.append(cols)
        if len(reports) >= chunk:
            _check(path, FileReports(reports, lines), columns, parser, seen)
            yield FileReports(reports, lines)
            reports, lines, columns = [], [], []
    if reports:
        _check(path, FileReports(reports, lines), columns, parser, seen)
        yield FileReports(reports, lines)


def _read_jsonl(path: Path, deployment) -> Iterator[tuple[dict, int, dict]]:
    with path.open("rb") as fh:
        for no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as err:
                col = re.search(r"column (\d+)", str(err))
                raise ReportFileError(path, no, int(col.group(1)) if col else None, f"not JSON ({err})") from None
            if type(obj) is not dict or "reports" in obj or "columns" in obj:
                raise ReportFileError(path, no, 1, 'each line must be one report {"user": ..., "step": ..., "values": {...}}')
            yield obj, no, {key: raw.find(orjson.dumps(key)) + 1 or None for key in _keys(obj)}


def _keys(obj: dict) -> list[str]:
    values = obj.get("values")
    return [k for k in obj if isinstance(k, str)] + (list(values) if isinstance(values, dict) else [])


def _read_csv(path: Path, deployment) -> Iterator[tuple[dict, int, dict]]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise ReportFileError(path, 1, None, "empty file: the header must be user,step,<attribute>...")
        known = ["user", "step", *deployment.attributes]
        for j, name in enumerate(header, 1):
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                raise ReportFileError(path, 1, f"{j} ({name!r})", f"unknown column {name!r}"
                                      + (f"; did you mean {hint[0]!r}?" if hint else "")
                                      + f" (columns are user, step and the declared attributes {list(deployment.attributes)})")
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
                raise ReportFileError(path, no, None, f"{len(rec)} fields, the header has {len(header)}")
            row = dict(zip(header, rec))
            try:
                step = int(row["step"])
            except ValueError:
                raise ReportFileError(path, no, where["step"], f"step {row['step']!r} is not an integer") from None
            values = {a: deployment.attributes[a].csv_value(v) for a, v in row.items()
                      if a not in ("user", "step") and v != ""}
            yield {"user": row["user"], "step": step, "values": values}, no, where


def _check(path: Path, found: FileReports, columns: list[dict], parser: ReportParser, seen: np.ndarray) -> None:
    """Stop at the first report of the chunk the workers would reject (stateless checks) or a
    (user, step) already in the file (``seen``, updated)."""
    parsed = parser.parse([orjson.dumps(r) for r in found.reports])
    if parsed.rejections:
        rej = min(parsed.rejections, key=lambda r: r.message)
        rep = found.reports[rej.message]
        field = _blamed_field(rej, rep)
        raise ReportFileError(path, found.lines[rej.message], columns[rej.message].get(field) if field else None,
                              f"{rej.reason}: {rej.detail}")
    keys = parsed.rows * (parser.horizon + 1) + parsed.steps  # every report parsed: key i is report i
    again = np.flatnonzero(seen[keys])
    repeated = _repeats(keys)
    bad = min([*again.tolist(), *repeated]) if again.size or repeated else None
    if bad is not None:
        rep = found.reports[bad]
        earlier = ("earlier in the file" if again.size and bad in set(again.tolist())
                   else f"first on line {found.lines[int(np.flatnonzero(keys == keys[bad])[0])]}")
        raise ReportFileError(path, found.lines[bad], columns[bad].get("user"), f"a second report for user "
                              f"{rep['user']!r} at step {rep['step']} ({earlier}); the workers would dead-letter it "
                              "as duplicate")
    seen[keys] = True


def _repeats(keys: np.ndarray) -> list[int]:
    """Positions of keys that occurred before in ``keys``."""
    order = np.argsort(keys, kind="stable")
    s = keys[order]
    return order[1:][s[1:] == s[:-1]].tolist()


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
