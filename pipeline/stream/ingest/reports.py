"""Parse and validate raw report messages into arrays; everything rejected gets a reason.

Wire format (JSON):

* a single report  ``{"user": "<id>", "step": <int ≥ 1>, "values": {"<attribute>": <value>}}``
* a batch          ``{"reports": [<report>, ...]}`` (bulk ingestion: one Kafka message, many reports)
* a columnar batch ``{"columns": {"user": [...], "step": t or [...], "<attribute>": [...]}}`` — the
  fastest form (a typed decode and numpy, no per-report dicts); ``null`` in an
  attribute column means "not reported"; a rejected row is dead-lettered as the single report it
  stands for, with its row number as the batch index.

Values: binary attributes take 0/1 (or false/true); categorical attributes take a declared label
or its integer code; hashed (open-domain) attributes take a string, mapped to an id in [0, size)
by the public hash :func:`public_hash`, or an integer id. What a pandas user produces is accepted
where its meaning is unambiguous: an integral float (``1.0``) wherever an integer code or id is
accepted, and for binary attributes the strings ``"0"``/``"1"``, ``"0.0"``/``"1.0"`` and
``"true"``/``"false"`` (any case: ``"True"``); everything else (``0.5``, ``"yes"``, a bool as a
categorical code, a numeric string as a categorical code or hashed id — a string there is a label
or a hashed value) stays ``out_of_domain``. An attribute missing from a report is
imputed at step close. Stateless checks happen here (``malformed``, ``unknown_user``,
``out_of_domain``); checks that need per-user state (``duplicate``, ``late``, ``future_step``)
happen in :mod:`pipeline.stream.ingest.partition_state`. Nothing is dropped silently: every rejected report
comes back as a :class:`Rejection` carrying its original bytes — on a worker's own log, a batch
message whose every report one stateful check rejects as one :class:`Rejection` of the whole
message (:meth:`ParsedReports.reject`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, cast

import msgspec
import numpy as np
import orjson

from pipeline.attributes import MISSING, OUT_OF_DOMAIN, public_hash  # public_hash: re-exported

__all__ = ["REASONS", "Rejection", "ParsedReports", "ReportParser", "public_hash"]

REASONS = ("malformed", "unknown_user", "out_of_domain", "duplicate", "late", "future_step")

_FAST_CHUNK = 2048  # single-report messages decoded by the typed fast path per attempt
_FAST_MAX_BYTES = 4096  # longer messages (batches) skip the fast path


@dataclass(frozen=True)
class Rejection:
    """A rejected report, or a whole batch message (``batch_index`` None, ``reports`` its reports,
    ``original`` its bytes) whose every report one check rejected (:meth:`ParsedReports.reject`)."""

    reason: str
    detail: str
    original: bytes
    batch_index: int | None = None
    message: int = -1  # index of the source message in the parsed list (-> its log offset)
    reports: int = 1


@dataclass
class ParsedReports:
    """Accepted-so-far reports as arrays (one entry per report) plus the rejections.

    Per report only numbers are kept: its source message (an index into ``sources``) and its
    position in that message's batch (-1 for a single-report message). A report's bytes are
    rebuilt from its source only when it is rejected, so the accepted path has no per-report
    Python objects.

    With ``whole`` set (the direct apply path, :meth:`IngestCore.apply_reports`), a batch message
    whose every report one check rejects becomes one rejection of the message (see :meth:`reject`);
    it needs ``sizes`` and ``raw``, which only :meth:`ReportParser.parse` gives.
    """

    rows: np.ndarray
    steps: np.ndarray
    codes: dict[str, np.ndarray]  # attribute -> int64 code, -1 where the report did not carry it
    message: np.ndarray  # per report: index of its source message
    batch_index: np.ndarray  # per report: position in its batch message, -1 for a single report
    sources: list  # per message: its bytes, a row batch's decoded items, or a columnar batch
    rejections: list[Rejection] = field(default_factory=list)
    # batch message (index) -> the reports it holds as parsed, the parser's rejections included
    sizes: dict[int, int] | None = None
    raw: list | None = None  # per message: its bytes, as given to the parser
    whole: bool = False  # a batch message all rejected by one check: one rejection (reject)

    @classmethod
    def of_singles(cls, rows, steps, codes: dict) -> ParsedReports:
        """Reports given directly as arrays, each standing for an (empty) single-report message."""
        rows = np.asarray(rows, dtype=np.int64)
        return cls(
            rows=rows,
            steps=np.asarray(steps, dtype=np.int64),
            codes=codes,
            message=np.arange(rows.size),
            batch_index=np.full(rows.size, -1, dtype=np.int64),
            sources=[b""] * rows.size,
        )

    def __len__(self) -> int:
        return int(self.rows.size)

    def original(self, i: int) -> bytes:
        """Bytes of accepted report ``i``: the message itself, or the batch item re-encoded."""
        source, j = self.sources[self.message[i]], int(self.batch_index[i])
        if j < 0:
            return source
        if isinstance(source, _Columns):
            return orjson.dumps(source.item(j))
        return orjson.dumps(source[j])

    def reject(self, mask: np.ndarray, reason: str, detail: str) -> None:
        """Move the reports selected by ``mask`` into the rejections (stateful checks use this).

        With ``whole``, a batch message all of whose reports ``mask`` selects, none of them
        rejected before (by the parser or an earlier check), becomes one rejection carrying the
        message's bytes and its report count, and no report of it is re-encoded: a late step's
        upload is one dead letter per message, not one per report. The callers' masks select
        reports not rejected before, so such a message has no report accepted or rejected for
        another reason; one whose reports were partly taken away (forwarded to their owner) holds
        fewer here than ``sizes`` says and stays per report.
        """
        idx = np.flatnonzero(mask)
        if self.whole and idx.size:
            idx = self._reject_whole(idx, reason, detail)
        for i in idx:
            j = int(self.batch_index[i])
            self.rejections.append(
                Rejection(
                    reason,
                    detail,
                    bytes(self.original(int(i))),
                    None if j < 0 else j,
                    int(self.message[i]),
                )
            )

    def _reject_whole(self, idx: np.ndarray, reason: str, detail: str) -> np.ndarray:
        """Reject whole the batch messages all of whose reports are in ``idx`` (see :meth:`reject`);
        returns the reports of ``idx`` left to reject one by one."""
        if not self.sizes or self.raw is None:
            return idx
        msgs = self.message[idx]
        counts = np.bincount(msgs)
        before = {r.message for r in self.rejections}
        full = [
            m
            for m, n in self.sizes.items()
            if n > 0 and m < counts.size and counts[m] == n and m not in before
        ]
        if not full:
            return idx
        for m in full:
            self.rejections.append(
                Rejection(reason, detail, bytes(self.raw[m]), None, m, self.sizes[m])
            )
        whole = np.zeros(counts.size, dtype=bool)
        whole[full] = True
        return idx[~whole[msgs]]

    def take(self, mask: np.ndarray) -> ParsedReports:
        keep = np.flatnonzero(mask)
        return ParsedReports(
            rows=self.rows[keep],
            steps=self.steps[keep],
            codes={a: c[keep] for a, c in self.codes.items()},
            message=self.message[keep],
            batch_index=self.batch_index[keep],
            sources=self.sources,
            rejections=list(self.rejections),
            sizes=self.sizes,
            raw=self.raw,
            whole=self.whole,
        )


class ReportParser:
    """Validates reports against the public configuration (roster, attribute domains, horizon)."""

    def __init__(
        self,
        roster,
        attributes: dict,
        horizon: int,
        fast_chunk: int = _FAST_CHUNK,
        csv_hints: bool = False,
    ):
        """``fast_chunk``: single-report messages per fast-path attempt (0 = reference path only).
        ``csv_hints``: an ``out_of_domain`` detail says what a CSV cell may be (a file's checker)."""
        self.roster = roster
        self.fast_chunk = int(fast_chunk)
        self.horizon = int(horizon)
        self.attributes = dict(attributes)
        self._names = list(self.attributes)
        # value -> code (None: out of domain); column -> codes (MISSING, OUT_OF_DOMAIN): pipeline.attributes
        self._decoders = {name: attr.decoder() for name, attr in self.attributes.items()}
        self._column_decoders = {
            name: attr.column_decoder() for name, attr in self.attributes.items()
        }
        self._hints = {
            name: attr.domain_hint(csv=csv_hints) for name, attr in self.attributes.items()
        }
        self._fast_decode = self._single_report_decoder(self._names)
        self._fast_columns_decode = self._columnar_decoder(self._names)

    def outside(self, name: str, value) -> str:
        """An ``out_of_domain`` detail: the value, the attribute and what it allows."""
        return f"value {value!r} is outside the domain of {name!r}; {self._hints[name]}"

    @staticmethod
    def _single_report_decoder(names: list[str]):
        """A typed msgspec decoder of one single report (the fast path; ~2x orjson to dicts).

        It accepts a subset of what :meth:`parse` accepts: exactly the fields user (string), step
        (integer) and values (an object of known attributes, each a boolean, integer, float or
        string; no null). Anything else raises, and the message goes through the reference path.
        """
        value_type = bool | int | float | str | msgspec.UnsetType
        # gc=False: the structs hold only scalars, and a fetch makes millions of them, which would
        # otherwise trigger and lengthen the cyclic collector's passes
        values = msgspec.defstruct(
            "Values",
            [(name, value_type, msgspec.UNSET) for name in names],
            forbid_unknown_fields=True,
            gc=False,
        )
        report = msgspec.defstruct(
            "Report",
            [("user", str), ("step", int), ("values", values)],
            forbid_unknown_fields=True,
            gc=False,
        )
        return msgspec.json.Decoder(report).decode

    @staticmethod
    def _columnar_decoder(names: list[str]):
        """A typed msgspec decoder of one columnar batch (its fast path): a step or a step column of
        integers and the known columns, nothing else, as valid JSON; the user and attribute columns
        are kept as their JSON text (:func:`_user_column`, :func:`_int_column`). Anything else raises
        and the message goes through the reference path."""
        columns = msgspec.defstruct(
            "Columns",
            [
                ("user", msgspec.Raw),
                ("step", int | list[int]),
                *[(name, msgspec.Raw | msgspec.UnsetType, msgspec.UNSET) for name in names],
            ],
            forbid_unknown_fields=True,
            gc=False,
        )
        batch = msgspec.defstruct(
            "ColumnarBatch", [("columns", columns)], forbid_unknown_fields=True, gc=False
        )
        return msgspec.json.Decoder(batch).decode

    def parse(self, messages: list[bytes]) -> ParsedReports:
        rows: list[int] = []
        steps: list[int] = []
        codes: dict[str, list[int]] = {a: [] for a in self._names}
        batch_index: list[int] = []
        message: list[int] = []
        rejections: list[Rejection] = []
        sources: list[Any] = list(
            messages
        )  # a batch message's entry becomes its decoded items or columns
        sizes: dict[int, int] = {}  # batch message -> the reports it holds
        msg_no = 0

        def reject(reason: str, detail: str, raw, index: int | None = None) -> None:
            rejections.append(Rejection(reason, detail, raw, index, msg_no))

        def one(rep, raw, index: int | None) -> None:
            # raw is the message bytes, or None for a batch item (encoded only if it is rejected)
            if raw is None:
                raw = _Lazy(rep)
            if type(rep) is not dict:
                reject("malformed", "a report must be a JSON object", raw, index)
                return
            user, step, values = rep.get("user"), rep.get("step"), rep.get("values")
            if type(user) is not str or type(step) is not int or type(values) is not dict:
                reject(
                    "malformed",
                    "a report needs user (string), step (integer) and values (object)",
                    raw,
                    index,
                )
                return
            extra = set(rep) - {"user", "step", "values"}
            if extra:
                reject("malformed", f"unexpected fields {sorted(extra)}", raw, index)
                return
            if not 1 <= step <= self.horizon:
                reason = "future_step" if step > self.horizon else "malformed"
                reject(reason, f"step {step} outside 1..{self.horizon}", raw, index)
                return
            row = self.roster.row(user)
            if row < 0:
                reject("unknown_user", f"user {user!r} is not enrolled", raw, index)
                return
            decoded = {}
            for name, value in values.items():
                dec = self._decoders.get(name)
                if dec is None:
                    reject("malformed", f"unknown attribute {name!r}", raw, index)
                    return
                code = dec(value)
                if code is None:
                    reject("out_of_domain", self.outside(name, value), raw, index)
                    return
                decoded[name] = code
            if not decoded:
                reject("malformed", "values is empty", raw, index)
                return
            rows.append(row)
            steps.append(step)
            for name in self._names:
                codes[name].append(decoded.get(name, MISSING))
            batch_index.append(-1 if index is None else index)
            message.append(msg_no)

        segments: list[tuple] = []  # finished array segments, in message order

        def flush() -> None:
            if rows:
                segments.append(
                    (
                        np.asarray(rows, dtype=np.int64),
                        np.asarray(steps, dtype=np.int64),
                        {a: np.asarray(c, dtype=np.int64) for a, c in codes.items()},
                        np.asarray(message, dtype=np.int64),
                        np.asarray(batch_index, dtype=np.int64),
                    )
                )
                for lst in (rows, steps, batch_index, message, *codes.values()):
                    lst.clear()

        step_by = self.fast_chunk or max(len(messages), 1)
        for start in range(
            0, len(messages), step_by
        ):  # fast path a chunk at a time, else reference
            chunk = messages[start : start + step_by]
            seg = self._fast_singles(chunk, start) if self.fast_chunk else None
            if seg is not None:
                flush()
                segments.append(seg)
                continue
            for msg_no, raw in enumerate(chunk, start):
                seg = self._fast_columnar(raw, msg_no, sources) if self.fast_chunk else None
                if seg is not None:
                    flush()
                    segments.append(seg)
                    sizes[msg_no] = int(seg[0].size)
                    continue
                try:
                    msg = orjson.loads(raw)
                except (orjson.JSONDecodeError, TypeError) as err:
                    reject("malformed", f"not JSON: {err}"[:200], bytes(raw) if raw else b"")
                    continue
                if type(msg) is dict and "columns" in msg:
                    flush()
                    seg = self._columnar(msg, raw, msg_no, rejections, sources)
                    if seg is not None:
                        segments.append(seg)
                    if isinstance(sources[msg_no], _Columns):  # not rejected whole
                        sizes[msg_no] = len(sources[msg_no].cols["user"])
                    continue
                if type(msg) is dict and "reports" in msg:
                    items = msg["reports"]
                    if type(items) is not list or len(msg) != 1:
                        reject("malformed", 'a batch is {"reports": [...]} and nothing else', raw)
                        continue
                    sources[msg_no] = items
                    sizes[msg_no] = len(items)
                    for i, rep in enumerate(items):
                        one(rep, None, i)
                else:
                    one(msg, raw, None)

        flush()
        empty = np.zeros(0, dtype=np.int64)
        return ParsedReports(
            rows=np.concatenate([g[0] for g in segments]) if segments else empty,
            steps=np.concatenate([g[1] for g in segments]) if segments else empty,
            codes={
                a: np.concatenate([g[2][a] for g in segments]) if segments else empty
                for a in self._names
            },
            message=np.concatenate([g[3] for g in segments]) if segments else empty,
            batch_index=np.concatenate([g[4] for g in segments]) if segments else empty,
            sources=sources,
            rejections=[
                r
                if not isinstance(r.original, _Lazy)
                else Rejection(
                    r.reason, r.detail, orjson.dumps(r.original.obj), r.batch_index, r.message
                )
                for r in rejections
            ],
            sizes=sizes,
            raw=messages,
        )

    def _fast_singles(self, chunk: list, first: int) -> tuple | None:
        """An array segment for a chunk of single-report messages that are all accepted, else None.

        All or nothing: a chunk with any message the typed decoder refuses, or any report the
        stateless checks would reject, returns None and goes through the reference path, so the
        fast path never decides a rejection and its output equals the reference's (tested).
        """
        decode = self._fast_decode
        try:
            if (
                not chunk or max(map(len, chunk)) > _FAST_MAX_BYTES
            ):  # TypeError: a value-less record
                return None
            reps = list(map(decode, chunk))
            size = len(reps)
            rows = self.roster.rows_of_ids(list(map(_USER, reps)))
            steps = np.fromiter(map(_STEP, reps), dtype=np.int64, count=size)
            values = list(map(_VALUES, reps))
            codes = {}
            present = np.zeros(size, dtype=bool)
            for name in self._names:
                col = list(map(attrgetter(name), values))
                if msgspec.UNSET in col:  # a C-level scan; the values are builtin scalars
                    col = [None if v is msgspec.UNSET else v for v in col]
                c = self._column_codes(name, col)
                if (c == OUT_OF_DOMAIN).any():
                    return None
                present |= c >= 0
                codes[name] = c
        except (
            msgspec.DecodeError,
            msgspec.ValidationError,
            UnicodeError,
            TypeError,
            OverflowError,
        ):
            return None
        if (
            (rows < 0).any()
            or (steps < 1).any()
            or (steps > self.horizon).any()
            or not present.all()
        ):
            return None
        return rows, steps, codes, np.arange(first, first + size), np.full(size, -1, dtype=np.int64)

    def _fast_columnar(self, raw, msg_no: int, sources: list) -> tuple | None:
        """An array segment for a columnar batch whose rows are all accepted, decoded by the typed
        decoder, else None (the reference path decides). As for single reports, all or nothing: the
        fast path never decides a rejection, so its output equals the reference's (tested); a row's
        bytes, if a stateful check rejects it later, are rebuilt from the message as the reference
        path would (:class:`_RawColumns`)."""
        if type(raw) is not bytes or not raw.startswith(b'{"columns"'):
            return None
        try:
            cols = self._fast_columns_decode(raw).columns
            rows = _user_column(self.roster, bytes(cols.user))
            values = {
                name: _int_column(bytes(getattr(cols, name)))
                for name in self._names
                if getattr(cols, name) is not msgspec.UNSET
            }
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError, OverflowError):
            return None
        step, size = cols.step, rows.size
        if type(step) is list and len(step) != size:
            return None
        if type(step) is int:
            steps = np.full(size, min(max(step, 0), 2**62), dtype=np.int64)
        else:
            steps = np.fromiter(
                (v if abs(v) < 2**62 else 0 for v in step), dtype=np.int64, count=size
            )
        if (rows < 0).any() or (steps < 1).any() or (steps > self.horizon).any():
            return None
        codes, present = {}, np.zeros(size, dtype=bool)
        for name in self._names:
            if name not in values:
                codes[name] = np.full(size, MISSING, dtype=np.int64)
                continue
            c = self._in_domain(name, values[name])
            if values[name].size != size or size == 0 or (c == OUT_OF_DOMAIN).any():
                return None
            present |= c >= 0
            codes[name] = c
        if not present.all():
            return None
        sources[msg_no] = _RawColumns(raw)
        return rows, steps, codes, np.full(size, msg_no), np.arange(size)

    def _column_codes(self, name: str, col: list) -> np.ndarray:
        """Codes of one attribute's column: -1 for null (not reported), -2 for out of domain."""
        codes = self._int_codes(name, col)
        if codes is None:
            codes = self._float_codes(name, col)
        if codes is None:
            codes = np.fromiter(self._column_decoders[name](col), dtype=np.int64, count=len(col))
        return codes

    def _int_codes(self, name: str, col: list) -> np.ndarray | None:
        """Codes of a column holding only integers, vectorised (same codes as the column decoder:
        in-domain ints are their own code, others -2); None for any other column."""
        if not col or not _only(col, int):
            return None
        try:
            return self._in_domain(name, np.array(col, dtype=np.int64))
        except OverflowError:
            return None

    def _in_domain(self, name: str, values: np.ndarray) -> np.ndarray:
        size = int(self.attributes[name].size)
        return np.where((values >= 0) & (values < size), values, OUT_OF_DOMAIN)

    def _float_codes(self, name: str, col: list) -> np.ndarray | None:
        """Codes of a column holding only floats (a pandas column), vectorised: an integral float in
        the domain is its integer's code, any other float -2; None for any other column."""
        if not col or not _only(col, float):
            return None
        values = np.array(col, dtype=np.float64)
        size = int(self.attributes[name].size)
        ok = (values == np.floor(values)) & (values >= 0) & (values < size)
        return np.where(ok, values, OUT_OF_DOMAIN).astype(np.int64)

    def _columnar(
        self, msg: dict, raw: bytes, msg_no: int, rejections: list, sources: list
    ) -> tuple | None:
        """Decode a columnar batch; returns an array segment of its accepted rows (None if none)."""
        cols = msg["columns"]
        if len(msg) != 1 or type(cols) is not dict or type(cols.get("user")) is not list:
            rejections.append(
                Rejection(
                    "malformed",
                    'a columnar batch is {"columns": {"user": [...], ...}}',
                    bytes(raw),
                    None,
                    msg_no,
                )
            )
            return None
        users = cols["user"]
        size = len(users)
        unknown = set(cols) - {"user", "step", *self._names}
        step = cols.get("step")
        bad_len = [
            k for k, v in cols.items() if k != "step" and (type(v) is not list or len(v) != size)
        ]
        if (
            unknown
            or bad_len
            or not (type(step) is int or (type(step) is list and len(step) == size))
        ):
            detail = (
                f"unknown columns {sorted(unknown)}"
                if unknown
                else f"columns {bad_len or ['step']} must be lists as long as user"
            )
            rejections.append(Rejection("malformed", detail, bytes(raw), None, msg_no))
            return None
        table = sources[msg_no] = _Columns(cols)
        if _only(users, str):
            rows = self.roster.rows_of_ids(users)
        else:
            rows = self.roster.rows(users)
            rows[[type(u) is not str for u in users]] = -2  # malformed, not merely unknown
        if type(step) is int:
            steps = np.full(
                size, min(max(step, 0), 2**62), dtype=np.int64
            )  # huge: future_step, not OverflowError
        else:
            steps = np.fromiter(
                (v if type(v) is int and abs(v) < 2**62 else 0 for v in cast(list, step)),
                dtype=np.int64,
                count=size,
            )
        reason = np.zeros(size, dtype=np.int8)  # 0 ok; else an index into _COL_REASONS
        reason[rows == -2] = 1
        reason[(reason == 0) & (steps < 1)] = 1
        reason[(reason == 0) & (steps > self.horizon)] = 2
        reason[(reason == 0) & (rows < 0)] = 3
        codes = {}
        present = np.zeros(size, dtype=bool)
        blamed = {}  # row -> the attribute whose value is out of domain (rejected rows only)
        for name in self._names:
            col = cols.get(name)
            if col is None:
                codes[name] = np.full(size, MISSING, dtype=np.int64)
                continue
            c = self._column_codes(name, col)
            outside = (reason == 0) & (c == OUT_OF_DOMAIN)
            reason[outside] = 4
            blamed.update(dict.fromkeys(np.flatnonzero(outside).tolist(), name))
            present |= c >= 0
            codes[name] = c
        reason[(reason == 0) & ~present] = 5
        for j in np.flatnonzero(reason):
            why, detail = _COL_REASONS[int(reason[j])]
            if int(j) in blamed:
                detail = self.outside(blamed[int(j)], cols[blamed[int(j)]][j])
            rejections.append(
                Rejection(why, detail, orjson.dumps(table.item(int(j))), int(j), msg_no)
            )
        idx = np.flatnonzero(reason == 0)
        return (
            rows[idx],
            steps[idx],
            {a: c[idx] for a, c in codes.items()},
            np.full(idx.size, msg_no),
            idx,
        )


_COL_REASONS = {
    1: ("malformed", "a report needs user (string) and step (integer >= 1)"),
    2: ("future_step", "step beyond the horizon"),
    3: ("unknown_user", "user is not enrolled"),
    4: ("out_of_domain", "a value is outside its attribute's domain"),
    5: ("malformed", "no attribute reported"),
}


def _user_column(roster, text: bytes) -> np.ndarray:
    """Rows of a user column given as its JSON text. The common form — compact (``["u1","u2"]``),
    printable ASCII, no escapes — is cut into ids on the bytes themselves and looked up with no
    string objects made (:meth:`IdIndex.rows_of_spans`); any other text is decoded as a list of
    strings (raising if it is not one)."""
    buf = np.frombuffer(text, dtype=np.uint8)
    quotes = np.flatnonzero(buf == 34)
    index = roster.index()
    opens, closes = quotes[0::2], quotes[1::2]
    compact = (
        index is not None
        and b"\\" not in text
        and not quotes.size % 2
        and text[:1] == b"["
        and text[-1:] == b"]"
        and not ((buf < 0x20) | (buf > 0x7E)).any()
    ) and (
        (quotes.size == 0 and buf.size == 2)
        or (
            quotes.size > 0
            and opens[0] == 1
            and closes[-1] == buf.size - 2
            and (opens[1:] - closes[:-1] == 2).all()
            and (buf[closes[:-1] + 1] == 44).all()
        )
    )
    rows = index.rows_of_spans(text, opens + 1, closes - opens - 1) if compact else None
    return (
        rows if rows is not None else roster.rows_of_ids(msgspec.json.decode(text, type=list[str]))
    )


def _int_column(text: bytes) -> np.ndarray:
    """Values of an integer column given as its JSON text (valid JSON: msgspec checked it). The
    common form — compact, non-negative integers of at most 18 digits — is read by numpy's C text
    parser; any other text is decoded as a list of integers (raising if it is not one, or
    OverflowError beyond int64)."""
    body = np.frombuffer(text, dtype=np.uint8)[1:-1]
    if text[:1] == b"[" and body.size and body[0] != 44:
        commas = np.flatnonzero(body == 44)
        if (((body - 48) <= 9) | (body == 44)).all() and np.diff(
            commas, prepend=-1, append=body.size
        ).max() <= 19:
            return np.fromstring(text[1:-1], dtype=np.int64, sep=",")
    return np.array(msgspec.json.decode(text, type=list[int]), dtype=np.int64)


def _only(values: list, kind: type) -> bool:
    """Every element's type is exactly ``kind`` (bool is not int here)."""
    return set(map(type, values)) == {kind}


_USER, _STEP, _VALUES = attrgetter("user"), attrgetter("step"), attrgetter("values")


class _Columns:
    """A columnar batch; ``item(j)`` rebuilds row j as the single report it stands for."""

    __slots__ = ("_cols",)

    def __init__(self, cols: dict):
        self._cols: dict | None = cols

    @property
    def cols(self) -> dict:
        assert self._cols is not None  # given to the constructor
        return self._cols

    def item(self, j: int) -> dict:
        step = self.cols.get("step")
        values = {
            k: v[j] for k, v in self.cols.items() if k not in ("user", "step") and v[j] is not None
        }
        return {
            "user": self.cols["user"][j],
            "step": step if type(step) is int else cast(list, step)[j],
            "values": values,
        }


class _RawColumns(_Columns):
    """A columnar batch taken by the typed path: decoded as the reference path decodes it (orjson)
    only if a row's bytes are needed."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes):
        self.raw = raw
        self._cols = None

    @property
    def cols(self) -> dict:
        if self._cols is None:
            self._cols = orjson.loads(self.raw)["columns"]
        return self._cols


class _Lazy:
    """A batch item whose bytes are only needed if it is rejected."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj
