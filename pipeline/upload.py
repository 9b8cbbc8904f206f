"""Fast uploads of report files (CSV, JSONL, Parquet) as columnar batch messages.

What ``dpstream produce`` sends a file with.

The file is read whole with pyarrow and turned into arrays: roster rows, steps and, per attribute,
the integer code of every value (``-1``: not reported), with the rules of the workers' parser
(:mod:`pipeline.stream.ingest.reports`; a CSV cell as :meth:`csv_value` reads it) applied to whole
columns. The reports are grouped by (step, owning reports partition) and cut into batch messages
``{"columns": {"user": [...], "step": t, "<attribute>": [codes]}}`` of up to ``MAX_REPORT_BYTES``
(tens of thousands of reports each: few messages, so few objects in the broker's durable log), each
written to the partition that owns its users (murmur2 of the user id, as the workers expect:
nothing is forwarded). Before anything is sent, every message goes through the workers' own parser
(:class:`ReportParser`): a report it would reject, an unknown user, a step outside the horizon or
the same (user, step) twice stops the upload with nothing sent. The error then comes from the
per-report checker (:func:`check_report_file`: file, line and column, as before) for CSV and JSONL;
a Parquet file is named by row.

A JSONL file pyarrow cannot read as one table (a value that is a number on one line and a string
on another, an explicit ``null``) is read by the per-report reader instead: slower, same messages.

``replace``: every message carries the header ``dpstream-replace: 1`` — a correction: each report
replaces the one the workers hold for its (user, step) while that step is open (docs/streaming.md,
"Correcting an open step").
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, replace as dc_replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import orjson

from pipeline.attributes import MISSING, OUT_OF_DOMAIN, Attribute, CategoricalAttribute, public_hash
from pipeline.connections import kafka_security
from pipeline.fates import Receipt
from pipeline.producer import SendResult
from pipeline.stream.ingest.corrections import REPLACE_HEADER
from pipeline.stream.ingest.report_files import ReportFileError, check_report_file
from pipeline.stream.kafka.limits import MAX_MESSAGE_BYTES, MAX_REPORT_BYTES

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["Upload", "read_upload", "send_upload", "upload_file", "UPLOAD_SUFFIXES"]

UPLOAD_SUFFIXES = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_FILL = 0.9  # of MAX_REPORT_BYTES a message is planned to fill (the estimate is an upper bound)
_BINARY_TEXT = ["0", "1", "0.0", "1.0", "false", "true"]  # lower-cased spellings of a binary value
_BINARY_CODE = np.array([0, 1, 0, 1, 0, 1], dtype=np.int64)


@dataclass(frozen=True)
class Batch:
    """One message: the reports at ``index`` (positions in the file, in file order) of one step,
    all owned by reports partition ``partition``."""

    step: int
    partition: int
    index: np.ndarray
    value: bytes


@dataclass(frozen=True)
class Upload:
    """A checked file ready to send: its batch messages, and per step the count and first line."""

    path: Path
    kind: str
    deployment: Deployment
    reports_in_file: int
    batches: tuple[Batch, ...]
    counts: dict[int, int]
    first_rows: dict[int, int]  # step -> position in the file of its first report

    def __len__(self) -> int:
        return sum(self.counts.values())

    def steps(self) -> set[int]:
        return set(self.counts)

    def only_step(self, step: int) -> "Upload":
        return dc_replace(
            self,
            batches=tuple(b for b in self.batches if b.step == step),
            counts={step: self.counts[step]} if step in self.counts else {},
            first_rows={step: self.first_rows[step]} if step in self.first_rows else {},
        )

    @property
    def first_lines(self) -> dict[int, int]:
        """step -> line of its first report (Parquet: row number, 1-based)."""
        return {t: self.line_of_row(i) for t, i in self.first_rows.items()}

    def line_of_row(self, position: int) -> int:
        return _line_of(self, position)

    @cached_property
    def one_line_per_report(self) -> bool:
        """The file (CSV, JSONL) has one line per report (and the CSV header): no blank lines and
        no quoted line breaks, so a report's line is arithmetic."""
        return _one_line_per_report(self)

    def line_of(self, index: int) -> int | None:
        """Line of the ``index``-th report sent (:func:`send_upload` numbers them message by
        message)."""
        for batch in self.batches:
            if index < batch.index.size:
                return self.line_of_row(int(batch.index[index]))
            index -= batch.index.size
        return None


# -- reading ------------------------------------------------------------------------------
def read_upload(path: str | Path, deployment: Deployment, roster) -> Upload:
    """Read and check a whole report file; :class:`ReportFileError` (nothing to send) if any report
    would be rejected by the workers' stateless checks or repeats a (user, step) of the file."""
    path = Path(path)
    kind = UPLOAD_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ReportFileError(
            path,
            None,
            None,
            f"unknown file type {path.suffix!r}: report files end in "
            + ", ".join(sorted(UPLOAD_SUFFIXES)),
        )
    if not path.exists():
        raise ReportFileError(path, None, None, "no such file")
    table = _arrow_table(path, kind, deployment)
    columns = _columns_of_table(path, kind, table, deployment) if table is not None else None
    if columns is None:  # not one table for pyarrow: the per-report reader (raises on a bad line)
        columns = _columns_of_reports(path, deployment, roster)
    users, steps, codes = columns
    problem = _first_problem(steps, codes, deployment)  # what needs no roster: steps and values
    if problem is not None:
        _refuse(path, kind, deployment, roster, *problem)
    batches = _batches(users, steps, codes, deployment)
    _check_with_parser(path, kind, batches, len(users), deployment, roster)
    values, first, counts = np.unique(steps, return_index=True, return_counts=True)
    return Upload(
        path,
        kind,
        deployment,
        len(users),
        tuple(batches),
        dict(zip(values.tolist(), counts.tolist())),
        dict(zip(values.tolist(), first.tolist())),
    )


def _arrow_table(path: Path, kind: str, deployment: Deployment):
    """The file as a pyarrow table of columns user, step and the attributes (None: pyarrow cannot
    read this CSV or JSONL as one table, or it holds something the per-report checker must name)."""
    import pyarrow as pa

    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.ParquetFile(
                path
            ).read()  # read_table imports pandas (seconds) for its metadata
        elif kind == "csv":
            import pyarrow.csv as pcsv

            with path.open(newline="", encoding="utf-8-sig") as fh:
                header = next(csv.reader(fh), None)
            known = {"user", "step", *deployment.attributes}
            if not header or set(header) - known or len(set(header)) != len(header):
                return None
            table = pcsv.read_csv(
                path,
                convert_options=pcsv.ConvertOptions(
                    column_types={name: pa.string() for name in header}, strings_can_be_null=False
                ),
            )
        else:
            import pyarrow.json as pjson

            with path.open("rb") as fh:
                if (
                    b"null" in fh.read()
                ):  # an explicit null is out of domain, an absent value is not
                    return None
            table = pjson.read_json(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError, OSError) as err:
        if kind == "parquet":
            raise ReportFileError(
                path, None, None, f"not a readable Parquet file ({err})"
            ) from None
        return None
    return _flattened(table)


def _flattened(table):
    """A ``values`` struct column (JSONL; Parquet written from nested reports) as attribute
    columns."""
    import pyarrow as pa

    if "values" not in table.column_names or not pa.types.is_struct(
        table.schema.field("values").type
    ):
        return table
    values = table.column("values").combine_chunks()
    rest = table.drop_columns(["values"])
    for field, inner in zip(
        values.type, values.flatten()
    ):  # flatten: a null object is null in every field
        if field.name in rest.column_names:
            return None
        rest = rest.append_column(field.name, inner)
    return rest


def _columns_of_table(
    path: Path, kind: str, table, deployment: Deployment
) -> tuple[list, np.ndarray, dict] | None:
    """(user ids, steps, attribute -> codes) of a table; None when its columns are not the expected
    ones and the per-report checker is to name the line (a Parquet file is refused here)."""
    import pyarrow as pa

    names = table.column_names
    extra = sorted(set(names) - {"user", "step", *deployment.attributes})
    if extra or "user" not in names or "step" not in names:
        return _refuse_columns(
            path,
            kind,
            f"unknown columns {extra}" if extra else "the file needs user and step " "columns",
        )
    user, step = table.column("user"), table.column("step")
    if (
        not (pa.types.is_string(user.type) or pa.types.is_large_string(user.type))
        or user.null_count
    ):
        return _refuse_columns(path, kind, "user must be a string in every row")
    if kind == "csv":
        try:
            step = step.cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    if not pa.types.is_integer(step.type) or step.null_count:
        return _refuse_columns(path, kind, "step must be an integer in every row")
    codes = {
        name: _codes(deployment.attributes[name], table.column(name), kind == "csv")
        for name in deployment.attributes
        if name in names
    }
    steps = np.clip(
        step.to_numpy().astype(np.int64, copy=False), -1, 2**31
    )  # beyond the horizon either way
    return user.combine_chunks(), steps, codes


def _codes(attribute: Attribute, column, csv_cells: bool) -> np.ndarray:
    """Codes of one attribute column, as the workers' parser decodes each value (``-1`` for a
    missing value, ``-2`` for one outside the domain), with whole-column operations."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind, size = attribute.type, int(attribute.size)
    out = np.full(len(arr), OUT_OF_DOMAIN, dtype=np.int64)
    t = arr.type
    if pa.types.is_null(t):
        out[:] = MISSING
        return out
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        present = np.ones(len(arr), dtype=bool)
        if csv_cells:
            present = ~pc.equal(arr, "").to_numpy(zero_copy_only=False)
        if isinstance(attribute, CategoricalAttribute):  # kind "categorical"
            at = pc.index_in(arr, value_set=pa.array(list(attribute.values)))
            out = at.fill_null(OUT_OF_DOMAIN).to_numpy(zero_copy_only=False).astype(np.int64)
        elif kind == "binary":
            at = pc.index_in(pc.utf8_lower(arr), value_set=pa.array(_BINARY_TEXT))
            found = at.fill_null(-1).to_numpy(zero_copy_only=False)
            out = np.where(found >= 0, _BINARY_CODE[found], OUT_OF_DOMAIN)
        else:
            encoded = pc.dictionary_encode(arr)
            ids = np.array(
                [public_hash(s, size) for s in encoded.dictionary.to_pylist()], dtype=np.int64
            )
            out = ids[encoded.indices.to_numpy(zero_copy_only=False)] if ids.size else out
        if (
            csv_cells and kind != "categorical"
        ):  # a CSV cell that is an integer is that integer (csv_value)
            number = pc.match_substring_regex(pc.utf8_trim_whitespace(arr), r"^[+-]?[0-9]{1,18}$")
            number = number.to_numpy(zero_copy_only=False)
            if number.any():
                ints = pc.cast(
                    pc.utf8_trim_whitespace(arr.filter(pa.array(number))), pa.int64()
                ).to_numpy()
                out[number] = np.where((ints >= 0) & (ints < size), ints, OUT_OF_DOMAIN)
        out[~present] = MISSING
    elif pa.types.is_boolean(t):
        if kind == "binary":
            out = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int64)
    elif pa.types.is_integer(t):
        ints = arr.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        out = np.where((ints >= 0) & (ints < size), ints, OUT_OF_DOMAIN)
    elif pa.types.is_floating(t):
        floats = arr.fill_null(-1.0).to_numpy(zero_copy_only=False).astype(np.float64)
        ok = (floats == np.floor(floats)) & (floats >= 0) & (floats < size)
        out = np.where(ok, floats, OUT_OF_DOMAIN).astype(np.int64)
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    out[~valid] = MISSING
    return out


def _columns_of_reports(path: Path, deployment: Deployment, roster) -> tuple[list, np.ndarray, dict]:
    """The per-report reader's reports as columns (it raises on the first bad line)."""
    checked = check_report_file(path, deployment, roster)
    users, steps = [], []
    values: dict[str, list] = {name: [] for name in deployment.attributes}
    for reports, _ in checked.chunks():
        for rep in reports:
            users.append(rep["user"])
            steps.append(rep["step"])
            for name, col in values.items():
                col.append(rep["values"].get(name))
    decoders = {name: deployment.attributes[name].column_decoder() for name in values}
    codes = {
        name: np.fromiter(decoders[name](col), dtype=np.int64, count=len(col))
        for name, col in values.items()
    }
    import pyarrow as pa

    return pa.array(users, type=pa.string()), np.array(steps, dtype=np.int64), codes


# -- checks -------------------------------------------------------------------------------
_PROBLEMS = {
    "step": "step outside 1..{horizon}",
    "out_of_domain": "value {value!r} of {attribute!r} is outside its domain",
    "empty": "no attribute reported",
    "duplicate": "a second report for user {user!r} at step {step}",
}


def _first_problem(steps, codes, deployment: Deployment) -> tuple[int, str, str | None] | None:
    """(position, problem, attribute) of the first report with a step outside the horizon, a value
    outside its domain or no value, else None (users and repeats: :func:`_check_with_parser`)."""
    bad = {"step": (steps < 1) | (steps > deployment.horizon)}
    present, outside = np.zeros(steps.size, dtype=bool), np.zeros(steps.size, dtype=bool)
    for name, c in codes.items():
        bad[f"out_of_domain:{name}"] = c == OUT_OF_DOMAIN
        present |= c >= 0
        outside |= c == OUT_OF_DOMAIN
    bad["empty"] = ~present & ~outside
    return _first_of(bad)


def _first_of(bad: dict[str, np.ndarray]) -> tuple[int, str, str | None] | None:
    found = [(int(np.argmax(mask)), name) for name, mask in bad.items() if mask.any()]
    if not found:
        return None
    at, name = min(found)
    problem, _, attribute = name.partition(":")
    return at, problem, attribute or None


def _refuse(
    path: Path,
    kind: str,
    deployment: Deployment,
    roster,
    at: int,
    problem: str,
    attribute: str | None,
    detail: str | None = None,
):
    """Raise the per-report checker's error (CSV, JSONL: line and column), else name the row."""
    if kind != "parquet":
        check_report_file(path, deployment, roster)  # raises, naming the line and column
    if detail is None:
        detail = _PROBLEMS[problem].format(
            horizon=deployment.horizon,
            attribute=attribute,
            value=_cell(path, kind, at, attribute),
            user=_cell(path, kind, at, "user"),
            step=_cell(path, kind, at, "step"),
        )
    else:
        detail = f"{problem}: {detail}"
    raise ReportFileError(
        path, None, None, f"row {at + 1}: {detail}; the workers would dead-letter it; nothing sent"
    )


def _refuse_columns(path: Path, kind: str, why: str):
    if kind != "parquet":
        return None  # read_upload falls back: the per-report checker names line and column
    raise ReportFileError(
        path, None, None, f"{why} (columns are user, step and the declared attributes)"
    )


def _cell(path: Path, kind: str, at: int, column: str | None):
    if column is None:
        return None
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path).read()
    if column not in table.column_names and "values" in table.column_names:
        return table.column("values")[at].as_py().get(column)
    return table.column(column)[at].as_py() if column in table.column_names else None


def _check_with_parser(
    path: Path, kind: str, batches: list[Batch], expected: int, deployment: Deployment, roster
) -> None:
    """Every message through the workers' parser: all its reports accepted (enrolled users: the
    parser looks them up), and no (user, step) twice in the file."""
    from pipeline.stream.ingest.reports import ReportParser

    parsed = ReportParser(roster, deployment.attributes, deployment.horizon).parse(
        [b.value for b in batches]
    )
    starts = np.cumsum([0] + [b.index.size for b in batches])
    positions = (
        np.concatenate([b.index for b in batches]) if batches else np.zeros(0, dtype=np.int64)
    )
    problems: dict[str, tuple[int, str, str | None]] = {}
    if parsed.rejections:
        rejected_at = [int(positions[starts[r.message] + (r.batch_index or 0)]) for r in parsed.rejections]
        rej = parsed.rejections[int(np.argmin(rejected_at))]
        problems["parser"] = (min(rejected_at), rej.reason, rej.detail)
    if (
        len(parsed) == expected
    ):  # each report once: a repeated (user, step) is the later one in the file
        where = positions[starts[parsed.message] + parsed.batch_index]
        key = parsed.rows * (deployment.horizon + 1) + parsed.steps
        order = np.lexsort((where, key))
        again = order[1:][key[order[1:]] == key[order[:-1]]]
        if again.size:
            problems["duplicate"] = (int(where[again].min()), "duplicate", None)
    elif not problems:
        problems["parser"] = (0, "malformed", f"{len(parsed)} of {expected} reports accepted")
    if problems:
        at, reason, detail = min(problems.values(), key=lambda p: p[0])
        _refuse(path, kind, deployment, roster, at, reason, None, detail)


# -- messages -----------------------------------------------------------------------------
def _batches(users, steps, codes, deployment: Deployment) -> list[Batch]:
    """The batch messages: per step, per owning partition (murmur2 of the user id), file order
    within, at most ``MAX_REPORT_BYTES`` each (planned from the widest user id and code)."""
    import pyarrow.compute as pc

    partitions = deployment.topics.partitions
    owners = _owners(users, partitions)
    key = steps * partitions + owners
    order = np.argsort(key, kind="stable")
    widest = (
        (pc.max(pc.binary_length(users)).as_py() or 0)
        + 3
        + sum(
            len(orjson.dumps(name))
            + 1
            + max(len(str(int(deployment.attributes[name].size) - 1)), 4)
            + 1
            for name in codes
        )
    )
    per_message = max(1, int(_FILL * MAX_REPORT_BYTES // widest))
    key = key[order]
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    quoted = _quoted(users.take(order))
    out = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        for start in range(lo, hi, per_message):
            stop = min(start + per_message, hi)
            index = order[start:stop]
            out += _messages(
                int(steps[index[0]]), int(owners[index[0]]), index, quoted, start, codes
            )
    return out


def _owners(users, partitions: int) -> np.ndarray:
    """Owning reports partition of every user id of a pyarrow string array (murmur2 on its
    buffers)."""
    import pyarrow as pa

    from pipeline.stream.ingest.murmur import murmur2_of_bytes, partition_of_hashes

    users = users.cast(pa.large_string())
    offsets = np.frombuffer(users.buffers()[1], dtype=np.int64)[
        users.offset : users.offset + len(users) + 1
    ]
    data = users.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return partition_of_hashes(murmur2_of_bytes(raw, offsets), partitions)


def _quoted(users):
    """Every user id as a JSON string (an array of bytes ``"id"``), with no Python object per id;
    ids that need escaping (quote, backslash, control characters) are encoded by orjson."""
    import pyarrow as pa
    import pyarrow.compute as pc

    users = users.cast(pa.large_string())
    data = users.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    if ((raw < 0x20) | (raw == 0x22) | (raw == 0x5C)).any():
        return pa.array([orjson.dumps(u) for u in users.to_pylist()], type=pa.large_binary())
    quote = pa.scalar('"', type=pa.large_string())
    return pc.binary_join_element_wise(
        quote, users, quote, pa.scalar("", type=pa.large_string())
    ).cast(pa.large_binary())


def _user_list(quoted, start: int, stop: int) -> bytes:
    """``[...]`` of the quoted ids ``start:stop``: one join in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    part = quoted.slice(start, stop - start)
    listed = pa.LargeListArray.from_arrays(pa.array([0, len(part)], type=pa.int64()), part)
    return b"[" + pc.binary_join(listed, pa.scalar(b",", type=pa.large_binary()))[0].as_py() + b"]"


def _messages(
    step: int, partition: int, index: np.ndarray, quoted, start: int, codes: dict
) -> list[Batch]:
    columns = [b'"user":' + _user_list(quoted, start, start + index.size), b'"step":%d' % step]
    for name, c in codes.items():
        chunk = c[index]
        if (chunk < 0).all():
            continue
        if (
            chunk < 0
        ).any():  # null: not reported (the typed decoder then leaves it to the reference path)
            # numpy's stubs have no np.where(cond, None, y) overload (an object array at run time)
            text = orjson.dumps(np.where(chunk < 0, None, chunk).tolist())  # type: ignore[attr-defined]
        else:
            text = orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)
        columns.append(orjson.dumps(name) + b":" + text)
    value = b'{"columns":{' + b",".join(columns) + b"}}"
    if len(value) > MAX_REPORT_BYTES and index.size > 1:  # the estimate was short: halve
        half = index.size // 2
        return _messages(step, partition, index[:half], quoted, start, codes) + _messages(
            step, partition, index[half:], quoted, start + half, codes
        )
    return [Batch(step, partition, index, value)]


def _line_of(upload: Upload, position: int) -> int:
    """Line of the report at ``position`` (0-based) in the file (Parquet: its row, 1-based).
    When the file has exactly one line per report (plus the CSV header) that is arithmetic;
    otherwise (blank lines, quoted line breaks) the per-report reader counts."""
    if upload.kind == "parquet":
        return position + 1
    head = 1 if upload.kind == "csv" else 0
    if upload.one_line_per_report:
        return position + 1 + head
    from itertools import islice

    from pipeline.stream.ingest.report_files import _records

    return next(islice(_records(upload.path, upload.deployment), position, None))[0]


def _one_line_per_report(upload: Upload) -> bool:
    head = 1 if upload.kind == "csv" else 0
    with upload.path.open("rb") as fh:
        data = fh.read()
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    return lines == upload.reports_in_file + head


# -- sending ------------------------------------------------------------------------------
def batch_producer(bootstrap: str):
    """The kafka-python producer of the upload's batch messages (and of its benchmark's raw
    baseline): acks=all, ~1 MB batches. Not idempotent, as pipeline.stream.kafka.producer: the
    embedded broker acknowledges a batch retried after a kill -9 as a duplicate it never stored
    (docs/streaming.md, "What is durable where")."""
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, **kafka_security(), linger_ms=5,
                         batch_size=1 << 20, max_request_size=MAX_MESSAGE_BYTES, acks="all",
                         enable_idempotence=False)


def send_upload(
    upload: Upload,
    bootstrap: str,
    topic: str,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 60.0,
) -> SendResult:
    """Send every batch to its partition (acks=all) and wait for the acknowledgements; the result
    counts reports (a message's reports are acknowledged together). ``replace``: each message
    carries
    the correction header."""
    producer = batch_producer(bootstrap)
    headers = [(REPLACE_HEADER, b"1")] if replace else None
    start, result = time.monotonic(), SendResult(receipt=Receipt(topic))
    try:
        futures = [
            producer.send(topic, value=b.value, partition=b.partition, headers=headers)
            for b in upload.batches
        ]
        producer.flush(timeout=timeout)
        for batch, future in zip(upload.batches, futures):
            try:
                stored = future.get(timeout=max(0.1, timeout - (time.monotonic() - start)))
                result.acknowledged += batch.index.size
                if result.receipt is not None:
                    result.receipt.add(stored.partition, stored.offset, batch.index.size)
            except Exception as err:  # noqa: BLE001 - a failed message: reported by its first report
                result.failed.append((result.sent, f"{type(err).__name__}: {err}"))
            result.sent += batch.index.size
            if progress is not None:
                progress(result.sent, len(upload))
    finally:
        producer.close()
    result.seconds = time.monotonic() - start
    return result


def upload_file(
    path: str | Path,
    deployment: Deployment,
    bootstrap: str,
    roster=None,
    step: int | None = None,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SendResult:
    """Read, check and send a report file (``step``: only that step's reports); raises
    :class:`ReportFileError` with nothing sent when a report would be rejected."""
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.topics import topic_names

    roster = roster or Roster.from_config(deployment.roster)
    upload = read_upload(path, deployment, roster)
    if step is not None:
        upload = upload.only_step(step)
    return send_upload(upload, bootstrap, topic_names(deployment)["reports"], replace, progress)
