"""Parse and validate raw report messages into arrays; everything rejected gets a reason.

Wire format (JSON):

* a single report  ``{"user": "<id>", "step": <int ≥ 1>, "values": {"<attribute>": <value>}}``
* a batch          ``{"reports": [<report>, ...]}`` (bulk ingestion: one Kafka message, many reports)

Values: binary attributes take 0/1 (or false/true); categorical attributes take a declared label
or its integer code; hashed (open-domain) attributes take a string, mapped to an id in [0, size)
by the public hash :func:`public_hash`, or an integer id. An attribute missing from a report is
imputed at step close. Stateless checks happen here (``malformed``, ``unknown_user``,
``out_of_domain``); checks that need per-user state (``duplicate``, ``late``, ``future_step``)
happen in :mod:`pipeline.stream.user_state`. Nothing is dropped silently: every rejected report
comes back as a :class:`Rejection` carrying its original bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import orjson

__all__ = ["REASONS", "Rejection", "ParsedReports", "ReportParser", "public_hash"]

REASONS = ("malformed", "unknown_user", "out_of_domain", "duplicate", "late", "future_step", "wrong_partition")

_MAX_STEP = 2**31 - 1


def public_hash(value: str, size: int) -> int:
    """Public, deterministic map of an open-domain string to an id in [0, size) (BLAKE2b-64)."""
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % size


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str
    original: bytes
    batch_index: int | None = None
    message: int = -1  # index of the source message in the parsed list (-> its log offset)


@dataclass
class ParsedReports:
    """Accepted-so-far reports as arrays (one entry per report) plus the rejections."""

    rows: np.ndarray
    steps: np.ndarray
    codes: dict[str, np.ndarray]  # attribute -> int64 code, -1 where the report did not carry it
    originals: list  # per accepted report: its bytes, or the decoded batch item (encoded on rejection)
    batch_index: list[int | None]
    rejections: list[Rejection] = field(default_factory=list)
    message: list[int] = field(default_factory=list)  # per accepted report: index of its source message

    def __len__(self) -> int:
        return int(self.rows.size)

    def original(self, i: int) -> bytes:
        """Bytes of accepted report ``i``: the message itself, or the batch item re-encoded."""
        raw = self.originals[i]
        return raw if isinstance(raw, (bytes, bytearray, memoryview)) else orjson.dumps(raw)

    def reject(self, mask: np.ndarray, reason: str, detail: str) -> None:
        """Move the reports selected by ``mask`` into the rejections (stateful checks use this)."""
        for i in np.flatnonzero(mask):
            self.rejections.append(Rejection(reason, detail, bytes(self.original(i)), self.batch_index[i],
                                             self.message[i] if self.message else -1))

    def take(self, mask: np.ndarray) -> "ParsedReports":
        keep = np.flatnonzero(mask)
        return ParsedReports(
            rows=self.rows[keep],
            steps=self.steps[keep],
            codes={a: c[keep] for a, c in self.codes.items()},
            originals=[self.originals[i] for i in keep],
            batch_index=[self.batch_index[i] for i in keep],
            rejections=list(self.rejections),
            message=[self.message[i] for i in keep] if self.message else [],
        )


class ReportParser:
    """Validates reports against the public configuration (roster, attribute domains, horizon)."""

    def __init__(self, roster, attributes: dict, horizon: int):
        self.roster = roster
        self.horizon = int(horizon)
        self.attributes = dict(attributes)
        self._names = list(self.attributes)
        self._decoders = {name: self._decoder(attr) for name, attr in self.attributes.items()}

    @staticmethod
    def _decoder(attr):
        kind = attr.type
        if kind == "binary":
            def decode(v):
                if v is True or v is False:
                    return int(v)
                if type(v) is int and 0 <= v <= 1:
                    return v
                return None
        elif kind == "categorical":
            table = {label: i for i, label in enumerate(attr.values)}
            size = len(attr.values)

            def decode(v):
                if type(v) is str:
                    return table.get(v)
                if type(v) is int and 0 <= v < size:
                    return v
                return None
        else:  # hashed open domain
            size = int(attr.size)

            def decode(v):
                if type(v) is str:
                    return public_hash(v, size)
                if type(v) is int and 0 <= v < size:
                    return v
                return None
        return decode

    def parse(self, messages: list[bytes]) -> ParsedReports:
        rows: list[int] = []
        steps: list[int] = []
        codes: dict[str, list[int]] = {a: [] for a in self._names}
        originals: list[bytes] = []
        batch_index: list[int | None] = []
        message: list[int] = []
        rejections: list[Rejection] = []
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
                reject("malformed", "a report needs user (string), step (integer) and values (object)", raw, index)
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
                    reject("out_of_domain", f"value {value!r} is outside the domain of {name!r}", raw, index)
                    return
                decoded[name] = code
            if not decoded:
                reject("malformed", "values is empty", raw, index)
                return
            rows.append(row)
            steps.append(step)
            for name in self._names:
                codes[name].append(decoded.get(name, -1))
            originals.append(raw.obj if isinstance(raw, _Lazy) else raw)
            batch_index.append(index)
            message.append(msg_no)

        for msg_no, raw in enumerate(messages):
            try:
                msg = orjson.loads(raw)
            except (orjson.JSONDecodeError, TypeError) as err:
                reject("malformed", f"not JSON: {err}"[:200], bytes(raw) if raw else b"")
                continue
            if type(msg) is dict and "reports" in msg:
                items = msg["reports"]
                if type(items) is not list or len(msg) != 1:
                    reject("malformed", "a batch is {\"reports\": [...]} and nothing else", raw)
                    continue
                for i, rep in enumerate(items):
                    one(rep, None, i)
            else:
                one(msg, raw, None)

        return ParsedReports(
            rows=np.asarray(rows, dtype=np.int64),
            steps=np.asarray(steps, dtype=np.int64),
            codes={a: np.asarray(c, dtype=np.int64) for a, c in codes.items()},
            originals=originals,
            batch_index=batch_index,
            rejections=[r if not isinstance(r.original, _Lazy) else
                        Rejection(r.reason, r.detail, orjson.dumps(r.original.obj), r.batch_index, r.message)
                        for r in rejections],
            message=message,
        )


class _Lazy:
    """A batch item whose bytes are only needed if it is rejected."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj
