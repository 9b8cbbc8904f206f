"""Reading report files (CSV, JSONL) for ``dpstream produce``: the whole file is checked before anything is sent.

Every report of the file goes through the workers' own parser (:class:`ReportParser`, the same
rules as ingest), so a report the workers would dead-letter stops the send instead: a bad JSON line,
a non-integer or out-of-range step, a header naming an undeclared attribute, an unknown user, a
value outside its domain, or the same (user, step) twice. The error names the file, the line and the
column (CSV: the column number and header; JSONL: the character column where known). Nothing is
sent unless every line is good, so a partial send never happens.
"""

from __future__ import annotations

import csv
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from pipeline.stream.ingest.reports import ReportParser

__all__ = ["ReportFileError", "FileReports", "read_report_file", "first_rejection"]


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
    """Read and check a ``*.csv`` or ``*.jsonl`` report file; raises :class:`ReportFileError`."""
    path = Path(path)
    if not path.exists():
        raise ReportFileError(path, None, None, "no such file")
    reader = _read_csv if path.suffix.lower() == ".csv" else _read_jsonl
    found, columns = reader(path, deployment)
    _check(path, found, columns, deployment, roster)
    return found


def _read_jsonl(path: Path, deployment) -> tuple[FileReports, list[dict]]:
    reports, lines, columns = [], [], []
    with path.open("rb") as fh:
        for no, raw in enumerate(fh, 1):
            if no == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (UTF-8 text from Windows tools)
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as err:
                col = re.search(r"column (\d+)", str(err))
                raise ReportFileError(path, no, int(col.group(1)) if col else None, f"not JSON ({err})") from None
            if type(obj) is not dict or "reports" in obj or "columns" in obj:
                raise ReportFileError(path, no, 1, 'each line must be one report {"user": ..., "step": ..., "values": {...}}')
            reports.append(obj)
            lines.append(no)
            columns.append({key: raw.find(orjson.dumps(key)) + 1 or None for key in _keys(obj)})
    return FileReports(reports, lines), columns


def _keys(obj: dict) -> list[str]:
    values = obj.get("values")
    return [k for k in obj if isinstance(k, str)] + (list(values) if isinstance(values, dict) else [])


def _read_csv(path: Path, deployment) -> tuple[FileReports, list[dict]]:
    with path.open(newline="", encoding="utf-8-sig") as fh:  # a byte-order mark (Excel's "CSV UTF-8") is dropped
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
        reports, lines, columns = [], [], []
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
            reports.append({"user": row["user"], "step": step, "values": values})
            lines.append(no)
            columns.append(where)
    return FileReports(reports, lines), columns


def first_rejection(reports: list[dict], deployment, roster) -> tuple[int, str, str, object] | None:
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
            return i, "duplicate", (f"a second report for user {key[0]!r} at step {key[1]} (first: report "
                                    f"{seen[key]}); the workers would dead-letter it as duplicate"), None
        seen[key] = i
    return None


def _check(path: Path, found: FileReports, columns: list[dict], deployment, roster) -> None:
    """Stop at the first report the workers would reject (stateless checks) or a repeated (user, step)."""
    first = first_rejection(found.reports, deployment, roster)
    if first is None:
        return
    i, reason, detail, rej = first
    rep = found.reports[i]
    if rej is None:  # a repeated (user, step): name both lines
        first_line = next(found.lines[j] for j, r in enumerate(found.reports)
                          if (r["user"], r["step"]) == (rep["user"], rep["step"]))
        raise ReportFileError(path, found.lines[i], columns[i].get("user"), f"a second report for user "
                              f"{rep['user']!r} at step {rep['step']} (first on line {first_line}); the workers "
                              "would dead-letter it as duplicate")
    field = _blamed_field(rej, rep)
    raise ReportFileError(path, found.lines[i], columns[i].get(field) if field else None, f"{reason}: {detail}")


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
