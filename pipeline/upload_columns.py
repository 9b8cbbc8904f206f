"""A report file (CSV, JSONL, Parquet) read as columns, one chunk of reports at a time.

Each chunk is the user ids (a pyarrow string array), the steps and, per attribute, the integer
code of every value (``-1``: not reported, ``-2``: outside the domain; int8 when the domain has
at most 127 values, else int64: :func:`code_type`), with the rules of the
workers' parser (:mod:`pipeline.stream.ingest.reports`; a CSV cell as
:func:`pipeline.stream.ingest.report_files.csv_value` reads it) applied to whole columns. Memory is
a few chunks: Parquet is read by row groups' record batches (:meth:`pyarrow.parquet.ParquetFile.iter_batches`),
CSV and JSONL by blocks (:func:`pyarrow.csv.open_csv`, :func:`pyarrow.json.open_json`), in a thread
of their own one chunk ahead of the coding (:func:`arrow_chunks`).

A CSV or JSONL file pyarrow cannot read as one table (a value that is a number on one line and a
string on another, an explicit ``null``, a column it does not expect, a step that is not an
integer) raises :class:`NotTabular`, and the caller reads it with the per-report reader
(:func:`report_chunks`): slower, same columns. A Parquet file is refused instead, naming the
problem.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.arrow_arrays import (
    bools,
    int64s,
    integers,
    offsets_of,
    string_buffers,
    strings,
    valid_of,
    values_of,
)
from pipeline.attributes import CSV_INTEGER, CSV_SPACE, MISSING, OUT_OF_DOMAIN, public_hash
from pipeline.key_words import KeyWords
from pipeline.stream.ingest.report_files import ReportFileError, _chunks, _records

__all__ = [
    "CHUNK_ROWS",
    "Columns",
    "NotTabular",
    "arrow_chunks",
    "chunk_rows",
    "code_type",
    "report_chunks",
]

# reports per chunk: ~8 MB with its messages and derived arrays, and about two full messages per
# (step, partition) of a chunk at 4 partitions (~2 * 10^4 reports of short ids fill one). Twice
# 2^16: each numpy or Arrow call does twice the work for the same fixed cost and hand-off between
# the upload's threads (the check pass of 10^6 reports ~10% faster; peak memory ~30 MB higher)
CHUNK_ROWS = 1 << 17
_CSV_ROW_BYTES, _JSONL_ROW_BYTES = 32, 96  # a CSV or JSONL chunk's bytes per row
# a chunk of CSV or JSONL is read as this many blocks: the first chunk is one block (a CSV's
# first reports are checked ~10 ms after the start, not ~50), the next ones grow to a whole chunk
_BLOCKS_PER_CHUNK = 4
_ENCODED_ABOVE = 256  # cells: a longer text column of a binary or hashed attribute is encoded first
_BINARY_TEXT = ["0", "1", "0.0", "1.0", "false", "true"]  # lower-cased spellings of a binary value
_BINARY_CODE = np.array([0, 1, 0, 1, 0, 1], dtype=np.int64)


class NotTabular(Exception):
    """pyarrow cannot read this CSV or JSONL file as a table: the per-report reader takes it."""


@dataclass(frozen=True)
class Columns:
    """One chunk of the file's reports: positions ``start .. start + len - 1`` in the file."""

    start: int
    users: pa.Array
    steps: np.ndarray
    codes: dict[str, np.ndarray]
    cells: pa.Table | None = None  # the chunk as read (to quote a bad value); None: per report
    # what is worked out from the chunk once and read by more than one step (message order)
    derived: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return int(self.steps.size)

    @cached_property
    def step_range(self) -> tuple[int, int]:
        """(lowest, highest) step ((0, 0): no report), read by the check's rules, its count of
        steps and the build's grouping (each took the two reductions of its own)."""
        steps = self.steps
        return (int(steps.min()), int(steps.max())) if steps.size else (0, 0)

    def code_range(self, name: str) -> tuple[int, int]:
        """(lowest, highest) code of attribute ``name`` ((0, 0): no report), read by the check's
        rules and the build's text of codes."""
        made = self.derived.get(("range", name))
        if made is None:
            codes = self.codes[name]
            made = (int(codes.min()), int(codes.max())) if codes.size else (0, 0)
            self.derived[("range", name)] = made
        return made

    @cached_property
    def user_words(self) -> KeyWords:
        """The user ids' bytes as words (read by the check's roster rows, then by murmur2)."""
        return KeyWords(*string_buffers(self.users))

    def cell(self, position: int, column: str | None):
        """The value of ``column`` of the report at ``position`` (in the file) as read."""
        table = self.cells
        if column is None or table is None or column not in table.column_names:
            return None
        return table.column(column)[position - self.start].as_py()


def chunk_rows() -> int:
    """Reports per chunk: ``CHUNK_ROWS``, or the environment's ``DPSTREAM_UPLOAD_CHUNK_ROWS`` (a
    smaller chunk lowers the upload's memory; CSV and JSONL are read by blocks of about that many
    lines)."""
    text = os.environ.get("DPSTREAM_UPLOAD_CHUNK_ROWS", "").strip()
    if not text:
        return CHUNK_ROWS
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"DPSTREAM_UPLOAD_CHUNK_ROWS must be a positive integer, got {text!r}")
    return int(text)


def arrow_chunks(path: Path, kind: str, deployment) -> Iterator[Columns]:
    """The file's reports a chunk at a time, read by pyarrow; raises :class:`NotTabular` (CSV,
    JSONL) or :class:`ReportFileError` (Parquet) when it cannot be."""
    from pipeline.read_ahead import read_ahead

    start = 0
    # the file decoded in a thread of its own, a chunk ahead of the coding (this generator's
    # thread: the upload's read-ahead), which runs a chunk ahead of the check and build; on two
    # cores, with the blocks of _csv_reader, a CSV upload ~15% faster (docs/streaming.md)
    for table in read_ahead(_tables(path, kind, deployment)):
        columns = _columns(path, kind, _flattened(path, kind, table), deployment, start)
        start += len(columns)
        yield columns


def _tables(path: Path, kind: str, deployment) -> Iterator[pa.Table]:
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            # not pre-buffered: pyarrow would read ahead across row groups, memory growing with
            # the file; buffered: a row group's column chunk is read a MB at a time. Text values
            # of attributes are read as dictionaries (a handful of distinct values, stored so by
            # the writer): each distinct value is coded once, not once per report
            names = set(pq.read_schema(path).names)
            parquet = pq.ParquetFile(
                path,
                pre_buffer=False,
                buffer_size=1 << 20,
                read_dictionary=[name for name in deployment.attributes if name in names],
            )
            # decoded in this (the read-ahead) thread only: the check uses the other core;
            # Arrow's pool would add threads on top (~8% longer, ~5% more CPU)
            for batch in parquet.iter_batches(batch_size=chunk_rows(), use_threads=False):
                yield pa.Table.from_batches([batch])
            return
        row_bytes = _CSV_ROW_BYTES if kind == "csv" else _JSONL_ROW_BYTES
        block = _block_bytes(row_bytes)
        reader = _csv_reader(path, deployment) if kind == "csv" else _jsonl_reader(path)
        blocks = -(-path.stat().st_size // block)  # about: a block ends at a line's end
        yield from _grown(reader, chunk_rows(), blocks)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError, OSError) as err:
        if kind == "parquet":
            raise ReportFileError(
                path, None, None, f"not a readable Parquet file ({err})"
            ) from None
        raise NotTabular(str(err)) from None


def _grown(
    batches: Iterator[pa.RecordBatch], rows: int, blocks: int | None = None
) -> Iterator[pa.Table]:
    """The blocks' batches as tables: the first one batch, each next of at least twice the rows of
    the last, up to ``rows``; and, of a file of about ``blocks`` blocks, its last
    ``_BLOCKS_PER_CHUNK`` blocks one by one (what the check, build and send do after the last block
    is decoded is then a block's work, not a chunk's)."""
    held: list[pa.RecordBatch] = []
    size, goal = 0, 0
    for seen, batch in enumerate(batches, start=1):
        held.append(batch)
        size += batch.num_rows
        if size >= goal or (blocks is not None and blocks - seen < _BLOCKS_PER_CHUNK):
            yield pa.Table.from_batches(held)
            goal = min(rows, 2 * size)
            held, size = [], 0
    if held:
        yield pa.Table.from_batches(held)


def _block_bytes(row_bytes: int) -> int:
    """Bytes of a CSV or JSONL block (``row_bytes`` a line)."""
    return max(1, chunk_rows() * row_bytes // _BLOCKS_PER_CHUNK)


def _csv_reader(path: Path, deployment):
    import pyarrow.csv as pcsv

    with path.open(newline="", encoding="utf-8-sig") as fh:
        header = next(csv.reader(fh), None)
    known = {"user", "step", *deployment.attributes}
    if not header or set(header) - known or len(set(header)) != len(header):
        raise NotTabular("the header is for the per-report checker to name")
    # one thread: Arrow's pool would parse blocks ahead on both cores, the coding and the check
    # waiting ~50 ms for the first. The step read as an integer (~5 ms per 10^6 less than a cast
    # of its text; a cell that is not one raises, and the per-report reader takes the file)
    types = {name: pa.string() for name in header} | {"step": pa.int64()}
    return pcsv.open_csv(
        path,
        read_options=pcsv.ReadOptions(
            block_size=_block_bytes(_CSV_ROW_BYTES),
            use_threads=False,
        ),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False),
    )


def _jsonl_reader(path: Path):
    import pyarrow.json as pjson

    if _holds(path, b"null"):  # an explicit null is out of domain, an absent value is not
        raise NotTabular("an explicit null")
    block = _block_bytes(_JSONL_ROW_BYTES)
    return pjson.open_json(path, read_options=pjson.ReadOptions(block_size=block))


def _holds(path: Path, needle: bytes, block: int = 1 << 20) -> bool:
    """Whether the file's bytes contain ``needle`` (read a block at a time)."""
    tail = b""
    with path.open("rb") as fh:
        while data := fh.read(block):
            if needle in tail + data[: len(needle)] or needle in data:
                return True
            tail = data[-len(needle) :]
    return False


def _flattened(path: Path, kind: str, table: pa.Table) -> pa.Table:
    """A ``values`` struct column (JSONL; Parquet written from nested reports) as attribute
    columns."""
    if "values" not in table.column_names or not pa.types.is_struct(
        table.schema.field("values").type
    ):
        return table
    values = _one_array(table.column("values"))
    rest = table.drop_columns(["values"])
    # flatten: a null object is null in every field
    for field, inner in zip(values.type, values.flatten()):
        if field.name in rest.column_names:
            _not_columns(path, kind, f"column {field.name!r} both in values and on its own")
        rest = rest.append_column(field.name, inner)
    return rest


def _columns(path: Path, kind: str, table: pa.Table, deployment, start: int) -> Columns:
    """The chunk's user ids, steps and codes; its columns must be the expected ones."""
    names = table.column_names
    extra = sorted(set(names) - {"user", "step", *deployment.attributes})
    if extra or "user" not in names or "step" not in names:
        why = f"unknown columns {extra}" if extra else "the file needs user and step columns"
        _not_columns(path, kind, why)
    user, step = _one_array(table.column("user")), _one_array(table.column("step"))
    if not (pa.types.is_string(user.type) or pa.types.is_large_string(user.type)):
        _not_columns(path, kind, "user must be a string in every row")
    if user.null_count:
        _not_columns(path, kind, "user must be a string in every row")
    if not pa.types.is_integer(step.type) or step.null_count:
        _not_columns(path, kind, "step must be an integer in every row")
    codes = {
        name: _codes(attribute, table.column(name), kind == "csv").astype(
            code_type(attribute), copy=False
        )
        for name, attribute in deployment.attributes.items()
        if name in names
    }
    # beyond the horizon either way (clipped only when a step is outside -1..2^31)
    steps = values_of(step)
    if steps.size and (steps.min() < -1 or steps.max() > 2**31):
        steps = np.clip(steps.astype(np.int64), -1, 2**31)
    else:
        steps = steps.astype(np.int64, copy=False)
    return Columns(start, user, steps, codes, table)


def code_type(attribute) -> np.dtype:
    """The type of an attribute's codes in a chunk: int8 when its domain has at most 127 values
    (codes -2 .. 126: a binary or a few labels, the usual), else int64. The check's reductions
    and the build's text of codes read a byte a report, not 8 (~2 ms per 10^6 reports of two
    such attributes less in the check and build, their thread the upload's busiest)."""
    return np.dtype(np.int8) if int(attribute.size) <= 127 else np.dtype(np.int64)


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is (``combine_chunks`` copies even one)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _not_columns(path: Path, kind: str, why: str):
    """A table whose columns are not the expected ones: the per-report checker names the line
    (CSV, JSONL); a Parquet file is refused here."""
    if kind != "parquet":
        raise NotTabular(why)
    raise ReportFileError(
        path, None, None, f"{why} (columns are user, step and the declared attributes)"
    )


def _codes(attribute, column, csv_cells: bool, distinct: bool = False) -> np.ndarray:
    """Codes of one attribute column, as the workers' parser decodes each value (``-1`` for a
    missing value, ``-2`` for one outside the domain), with whole-column operations.
    ``distinct``: the values are a dictionary's (each coded as it is)."""
    if isinstance(column, pa.ChunkedArray) and column.num_chunks > 1:
        # a table of several batches (CSV, JSONL: a chunk is up to 4 blocks): each part coded
        # alone and the codes joined, a byte a cell, where combining the text first copied every
        # cell's bytes (~1.3 ms per 10^6 CSV reports of two attributes). The rules read each
        # cell alone: its code is the same in any part
        return np.concatenate([_codes(attribute, part, csv_cells) for part in column.chunks])
    arr = _one_array(column) if isinstance(column, pa.ChunkedArray) else column
    kind, size = attribute.type, int(attribute.size)
    t = arr.type
    if pa.types.is_null(t):
        return np.full(len(arr), MISSING, dtype=np.int64)
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if text and kind != "categorical" and not distinct and len(arr) > _ENCODED_ABOVE:
        # a binary or hashed attribute's text (CSV's every column) coded by its distinct values:
        # lower-casing, hashing and CSV's integer rule cost ~0.5 us a cell, ~80 ms per 10^6
        # binary cells; a dictionary's encoding ~20 ms, then a handful of values. A binary
        # column's usual cells, "0" and "1", are read from the bytes first (~4 ms per 10^6)
        if kind != "binary":
            return _codes(attribute, pc.dictionary_encode(arr), csv_cells)
        out, rest = _zero_one_cells(arr)
        if rest.size:
            others = pc.dictionary_encode(arr.take(int64s(rest)))
            out[rest] = _codes(attribute, others, csv_cells)
        return out
    if pa.types.is_dictionary(t):  # each distinct value coded once
        coded = _codes(attribute, arr.dictionary, csv_cells, distinct=True)
        if not coded.size:
            out = _outside(len(arr))
        else:
            # Arrow's take: numpy's gathers by the int32 indices a reader writes convert them
            # to 64 bits first (~0.9 ms for 2^17 indices, against ~0.15 ms)
            coded = integers(coded, code_type(attribute))  # codes of their chunk's type
            out = values_of(pc.take(coded, arr.indices))  # Arrow's buffer: read-only
            out = out.copy() if arr.null_count else out
        if arr.null_count:
            out[~valid_of(arr)] = MISSING
        return out
    if text:
        present = np.ones(len(arr), dtype=bool)
        if csv_cells:
            present = values_of(pc.binary_length(arr)) > 0
        if kind == "categorical":
            labelled = _label_codes(arr, attribute.values)
            if labelled is not None:
                out = labelled
            else:
                at = pc.index_in(arr, value_set=strings(list(attribute.values)))
                # written in the codes' type at once (not int64, then cast)
                out = values_of(_filled(at, OUT_OF_DOMAIN)).astype(code_type(attribute))
        elif kind == "binary":
            at = pc.index_in(pc.utf8_lower(arr), value_set=strings(_BINARY_TEXT))
            found = _ints(at, -1)
            out = np.where(found >= 0, _BINARY_CODE[found], OUT_OF_DOMAIN)
        else:
            encoded = pc.dictionary_encode(arr)
            ids = np.array(
                [public_hash(s, size) for s in encoded.dictionary.to_pylist()], dtype=np.int64
            )
            out = ids[_ints(encoded.indices, 0)] if ids.size else _outside(len(arr))
        if csv_cells and kind != "categorical":
            out = _csv_integers(arr, out, size)
        out[~present] = MISSING
    elif pa.types.is_boolean(t):
        out = _ints(arr, 0) if kind == "binary" else _outside(len(arr))
    elif pa.types.is_integer(t):
        ints = _ints(arr, 0)  # a null is missing whatever it is filled with (below)
        if ints.size and (ints.min() < 0 or ints.max() >= size):
            ints = np.where((ints >= 0) & (ints < size), ints, OUT_OF_DOMAIN)
        out = ints
    elif pa.types.is_floating(t):
        floats = values_of(_filled(arr, 0)).astype(np.float64)
        ok = (floats == np.floor(floats)) & (floats >= 0) & (floats < size)
        out = np.where(ok, floats, OUT_OF_DOMAIN).astype(np.int64)
    else:
        out = _outside(len(arr))
    if arr.null_count:
        out[~valid_of(arr)] = MISSING
    return out


_FEW_LABELS = 16  # labels matched word by word (more: Arrow's hash lookup)
_INLINE = 12  # bytes of a value an Arrow binary view holds inline


def _label_codes(arr: pa.Array, labels: list[str]) -> np.ndarray | None:
    """The int8 codes of a text column of a categorical attribute: each cell's label's index,
    ``OUT_OF_DOMAIN`` for any other text (a null's is any: the caller marks nulls missing). None
    when the labels are more than ``_FEW_LABELS`` or one is longer than 12 bytes, or this pyarrow
    has no binary views: Arrow's ``index_in`` codes them.

    Arrow's cast to ``binary_view`` writes every cell of up to 12 bytes inline in 16 bytes: its
    length (32 bits), its bytes, zeros after them (the columnar format's layout); a longer cell
    holds its length and a prefix, so it cannot equal a label's. A cell is a label when both its
    64-bit words are the label's: two comparisons per label over contiguous words, and the code
    added where they hold (labels are distinct: one at most). ~3.3 ms per 10^6 cells of three
    labels, against ~13 ms for ``index_in``'s hash per cell."""
    encoded = [label.encode("utf-8") for label in labels]
    if len(encoded) > _FEW_LABELS or any(len(label) > _INLINE for label in encoded):
        return None
    try:
        viewed = arr.cast(pa.binary_view())
    except (AttributeError, pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return None
    size = len(arr)
    views = np.frombuffer(viewed.buffers()[1], dtype="<u8").reshape(-1, 2)
    views = views[viewed.offset : viewed.offset + size]
    first, second = np.ascontiguousarray(views[:, 0]), np.ascontiguousarray(views[:, 1])
    out = np.full(size, OUT_OF_DOMAIN, dtype=np.int8)
    hit, also = np.empty(size, dtype=bool), np.empty(size, dtype=bool)
    step = np.empty(size, dtype=np.int8)
    for code, label in enumerate(encoded):
        padded = label.ljust(_INLINE, b"\0")
        low = len(label) | int.from_bytes(padded[:4], "little") << 32
        np.equal(first, np.uint64(low), out=hit)
        np.equal(second, np.uint64(int.from_bytes(padded[4:], "little")), out=also)
        hit &= also
        np.multiply(hit, np.int8(code - OUT_OF_DOMAIN), out=step)
        out += step
    return out


def _csv_integers(arr: pa.Array, out: np.ndarray, size: int) -> np.ndarray:
    """``out`` with the codes of the CSV cells that are whole numbers (the rule of
    :meth:`pipeline.attributes.BinaryAttribute.csv_value`): the number where it is in 0..size-1,
    else outside the domain."""
    trimmed = pc.utf8_trim(arr, characters=CSV_SPACE)
    number = pc.match_substring_regex(trimmed, CSV_INTEGER)
    number = values_of(number) & valid_of(number)
    if not number.any():
        return out
    # "+1" is 1, as int() reads it (Arrow's cast takes no plus sign); more than 18 digits after
    # the leading zeros is beyond int64, and beyond any domain
    signed = pc.utf8_ltrim(trimmed.filter(bools(number)), characters="+")
    digits = pc.utf8_ltrim(signed, characters="-0")  # the sign, then leading zeros
    short = values_of(pc.utf8_length(digits)) <= 18
    ints = np.full(short.size, OUT_OF_DOMAIN, dtype=np.int64)
    ints[short] = values_of(pc.cast(signed.filter(bools(short)), pa.int64()))
    out[number] = np.where((ints >= 0) & (ints < size), ints, OUT_OF_DOMAIN)
    return out


def _zero_one_cells(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(codes as int8, positions of the other cells) of a string array: 0 or 1 where the cell is
    the one byte "0" or "1" (in any rule of a binary attribute: that value), the others to be
    coded."""
    size = len(arr)
    offsets = offsets_of(arr)
    data = arr.buffers()[2]
    if data is None or not data.size or not size:  # every cell empty or null
        return np.zeros(size, dtype=np.int8), np.arange(size)
    starts: np.ndarray = offsets[:-1]
    first: np.ndarray = np.take(np.frombuffer(data, dtype=np.uint8), starts, mode="clip")
    digit = first - np.uint8(ord("0"))
    fast = (offsets[1:] - starts == 1) & (digit <= 1)  # below "0": wrapped above 1
    if arr.null_count:  # a null's slot may hold bytes
        fast &= valid_of(arr)
    return digit.view(np.int8), np.flatnonzero(~fast)  # a binary attribute's codes: int8


def _filled(arr: pa.Array, value: int) -> pa.Array:
    """``arr`` with its nulls set to ``value`` (cast to its type; not ``fill_null``, whose scalar
    imports pandas: :mod:`pipeline.arrow_arrays`)."""
    if not arr.null_count:
        return arr
    fill = int64s(np.array([value])).cast(arr.type)
    return pc.coalesce(arr, fill[0])


def _outside(size: int) -> np.ndarray:
    """Codes for a column of a type no value of which is in the domain (made only then, not
    up front for every column of every chunk)."""
    return np.full(size, OUT_OF_DOMAIN, dtype=np.int64)


def _ints(arr: pa.Array, value: int) -> np.ndarray:
    """The values as int64 (nulls as ``value``): a read-only view of an int64 array's buffer
    when it has no null (not copied: a chunk's column each time), else a copy."""
    return values_of(_filled(arr, value)).astype(np.int64, copy=bool(arr.null_count))


def report_chunks(path: Path, deployment) -> Iterator[Columns]:
    """The per-report reader's reports as columns, a chunk at a time (the file was checked by
    :func:`pipeline.stream.ingest.report_files.check_report_file`)."""
    decoders = {
        name: deployment.attributes[name].column_decoder() for name in deployment.attributes
    }
    start = 0
    for recs in _chunks(_records(path, deployment), chunk_rows()):
        reports = [rep for _, rep, _ in recs]
        values = {name: [rep["values"].get(name) for rep in reports] for name in decoders}
        codes = {
            name: np.fromiter(
                decoders[name](col), dtype=code_type(deployment.attributes[name]), count=len(col)
            )
            for name, col in values.items()
        }
        users = strings([rep["user"] for rep in reports])
        steps = np.array([rep["step"] for rep in reports], dtype=np.int64)
        yield Columns(start, users, steps, codes)
        start += len(reports)
