"""Reports from any producer: a report that arrives on a partition not owning its user is routed to
the owner through the ``repartition`` topic, with the guarantees of a direct report.

A user is owned by reports partition murmur2(user id) mod P (:mod:`pipeline.stream.ingest.roster`), which
is where the Java client, kafka-python and aiokafka put a report keyed by user id. librdkafka's
clients (confluent-kafka, kcat, the Go/.NET/Node clients) hash keys with CRC32 by default, and a
producer may send null keys or pick partitions at random: the user id in the value is what counts.

Protocol (docs/streaming.md, "Reports from any producer"):

* **Source side.** A worker handling reports partition q parses a run of reports; the rows of users
  owned elsewhere are sent, grouped by owner p, to partition p of ``repartition`` as batches of
  packed rows — roster row, step, attribute codes: what q's parse resolved, so p neither parses nor
  looks the ids up again (:class:`Forwarder`) — with headers naming the source partition, the
  format, and each row's source position (offset and row in its message). When it reaches the
  close marker of step s in q, it first waits until the broker
  has acknowledged everything it forwarded before the marker, then appends a *forwarded-through*
  marker ``{"step": s, "from": q}`` to **every** partition of ``repartition``. The checkpoint of q
  (written at the close) follows those acknowledgements, so a crash before it replays q from the
  previous close and forwards again: nothing forwarded is ever lost.
* **Owner side.** The worker owning p reads partition p of ``repartition`` too (co-partitioned, like
  ``feedback``). Records from source q after q's marker for step s belong to the interval after s:
  they wait until p has closed s. p closes s only once it has the close marker of s in its reports
  log *and* the forwarded-through markers of s from all P sources, with everything before them
  applied: every report routed before a close marker counts for the step, as if it had arrived
  direct.
* **Exactly once.** A replay of q forwards the same reports again (copies). The owner keeps per
  source the largest source position it has applied (in its checkpoint, with the resume offset of
  ``repartition``) and skips anything not beyond it, so a copy is never applied twice and never
  dead-lettered as a duplicate or late. Between reports for one (user, step) that reach p by
  different logs in the same interval, the precedence rule of
  :meth:`pipeline.stream.ingest.partition_state.PartitionState.apply` picks the same one whatever the
  interleaving, so a replay of p reproduces its partials byte for byte.
* **No cost for murmur2 producers.** With every report on its owner, ``repartition`` carries only
  the P markers per source and step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import orjson

from pipeline.releases.aggregators import narrow_int
from pipeline.stream.ingest.reports import ParsedReports
from pipeline.stream.kafka.messages import CONTROL_HEADER

__all__ = [
    "SOURCE_HEADER",
    "POSITIONS_HEADER",
    "FORMAT_HEADER",
    "ROWS",
    "FORWARDED",
    "FORWARD_CHUNK",
    "Forwarder",
    "ForwardMarkers",
    "Inbox",
    "is_rows",
    "source_of",
    "positions_of",
    "source_positions",
]

SOURCE_HEADER = "dpstream-from"  # the reports partition a forwarded record comes from
POSITIONS_HEADER = (
    "dpstream-positions"  # per row: its offset in the source partition, then its row there
)
FORMAT_HEADER = (
    "dpstream-format"  # b"rows": a batch of packed rows; absent: a JSON columnar batch (before)
)
ROWS = b"rows"
FORWARDED = b"forwarded-through"  # CONTROL_HEADER value of the per-step marker
FORWARD_CHUNK = 5000  # rows per forwarded batch (~25 bytes each with its position), far below 1 MB
_ITEM_BITS = 24  # a source position as one integer: offset << 24 | (row in its message + 1)


@dataclass
class ForwardMarkers:
    """Source partition ``partition`` reached the close marker of ``step``: send ``messages`` —
    (repartition partition, value, headers), one per partition — once everything sent before is
    acknowledged."""

    partition: int
    step: int
    messages: list[tuple[int, bytes, list]]


class Forwarder:
    """Encodes the foreign rows of a run of reports for their owners, and decodes them there.

    A forwarded batch (header ``dpstream-format: rows``) carries what the source already resolved —
    each report's roster row, step and attribute codes — as packed little-endian records
    (:attr:`dtype`), so the owner neither parses JSON nor looks ids up again. Every worker of a
    deployment has the same roster and attributes (its configuration fingerprint), hence the same
    layout. ``repartition`` is curator-side, but the owner still checks every row (roster row of
    its own, step and codes in their domains) and dead-letters a batch that fails as ``malformed``:
    a forged or garbled record never reaches the state.
    """

    def __init__(self, roster, attributes: dict, partitions: int, horizon: int):
        self.partitions = int(partitions)
        self.horizon = int(horizon)
        self.owners = roster.owners(self.partitions)
        self.ids = roster.ids
        self.names = list(attributes)
        self.sizes = np.array([int(attributes[a].size) for a in self.names], dtype=np.int64)
        self.labels = {
            name: np.asarray(attr.values, dtype=object) if attr.type == "categorical" else None
            for name, attr in attributes.items()
        }
        self.dtype = np.dtype(
            [
                ("row", "<u4" if roster.n <= 1 << 32 else "<u8"),
                ("step", "<u2" if self.horizon < 1 << 16 else "<u4"),
                *[
                    (f"a{i}", narrow_int(attributes[a].size - 1).newbyteorder("<"))
                    for i, a in enumerate(self.names)
                ],
            ]
        )

    def forward(
        self, source: int, offsets: np.ndarray, parsed, at: np.ndarray | None = None
    ) -> list[tuple[int, bytes, list]]:
        """(owner partition, value, headers) for the parsed reports ``parsed`` (users of other
        partitions); ``offsets[i]`` is the source offset of parsed message i. ``at``: the reports'
        (offset, item) positions instead, (2, reports) (a committed upload's: its commit's)."""
        size, width = len(parsed), self.dtype.itemsize
        owner = self.owners[parsed.rows]
        packed = np.empty(size, dtype=self.dtype)
        packed["row"], packed["step"] = parsed.rows, parsed.steps
        for i, name in enumerate(self.names):
            packed[f"a{i}"] = parsed.codes[name]
        positions = np.empty((2, size), dtype="<i8")
        if at is None:
            np.take(offsets, parsed.message, out=positions[0])
            positions[1] = parsed.batch_index
        else:
            positions[:] = at
        # grouped by owner, log order within each; rows gathered as raw bytes (a structured gather is 10x slower)
        order = np.argsort(owner, kind="stable")
        raw = np.take(packed.view(np.uint8).reshape(size, width), order, axis=0)
        positions, owner = np.take(positions, order, axis=1), owner[order]
        bounds = [0, *(np.flatnonzero(np.diff(owner)) + 1).tolist(), size]
        out = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            for start in range(lo, hi, FORWARD_CHUNK):
                stop = min(start + FORWARD_CHUNK, hi)
                headers = [
                    (SOURCE_HEADER, str(source).encode()),
                    (FORMAT_HEADER, ROWS),
                    (POSITIONS_HEADER, positions[:, start:stop].tobytes()),
                ]
                out.append((int(owner[start]), raw[start:stop].tobytes(), headers))
        return out

    def decode(self, records: list, partition: int) -> tuple[ParsedReports, list[int]]:
        """The reports of forwarded batches in the ``rows`` format, as parsed reports (message i is
        ``records[i]``, batch index the row in it), and the indices of records refused whole: not a
        whole number of rows, or a row of a user ``partition`` does not own, or out of domain."""
        arrays, refused = [], []
        for i, rec in enumerate(records):
            value = rec.value or b""
            if not value or len(value) % self.dtype.itemsize:
                refused.append(i)
                continue
            packed = np.frombuffer(value, dtype=self.dtype)
            rows, steps = packed["row"].astype(np.int64), packed["step"].astype(np.int64)
            codes = np.stack([packed[f"a{j}"].astype(np.int64) for j in range(len(self.names))])
            if (
                (rows < self.owners.size).all()
                and (self.owners[rows] == partition).all()
                and (steps >= 1).all()
                and (steps <= self.horizon).all()
                and ((codes >= -1) & (codes < self.sizes[:, None])).all()
                and (codes >= 0).any(axis=0).all()
            ):
                arrays.append((i, rows, steps, codes))
            else:
                refused.append(i)

        def cat(parts: list) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        parsed = ParsedReports(
            rows=cat([r for _, r, _, _ in arrays]),
            steps=cat([s for _, _, s, _ in arrays]),
            codes={name: cat([c[j] for *_, c in arrays]) for j, name in enumerate(self.names)},
            message=cat([np.full(r.size, i, dtype=np.int64) for i, r, _, _ in arrays]),
            batch_index=cat([np.arange(r.size, dtype=np.int64) for _, r, _, _ in arrays]),
            sources=[_Rows(self, rec.value) for rec in records],
        )
        return parsed, refused

    def report(self, row: int, step: int, codes: dict) -> dict:
        """A report as its producer could have sent it (labels for categorical values): the bytes a
        forwarded report is dead-lettered with, as on the source."""
        values = {
            a: (int(c) if (labels := self.labels[a]) is None else labels[c])
            for a, c in codes.items()
            if c >= 0
        }
        return {"user": self.ids[row], "step": int(step), "values": values}

    def markers(self, source: int, step: int) -> ForwardMarkers:
        value = orjson.dumps({"step": int(step), "from": int(source)})
        headers = [(CONTROL_HEADER, FORWARDED), (SOURCE_HEADER, str(source).encode())]
        return ForwardMarkers(source, step, [(p, value, headers) for p in range(self.partitions)])


class _Rows:
    """A forwarded batch as a parsed report's source: row j is rebuilt as a report only if rejected."""

    __slots__ = ("forwarder", "packed")

    def __init__(self, forwarder: Forwarder, value: bytes):
        self.forwarder, self.packed = forwarder, np.frombuffer(value or b"", dtype=np.uint8)

    def __getitem__(self, j: int) -> dict:
        fw = self.forwarder
        rec = self.packed[j * fw.dtype.itemsize : (j + 1) * fw.dtype.itemsize].view(fw.dtype)[0]
        return fw.report(
            int(rec["row"]),
            int(rec["step"]),
            {a: int(rec[f"a{i}"]) for i, a in enumerate(fw.names)},
        )


def is_rows(headers) -> bool:
    """A forwarded batch in the ``rows`` format (else: a JSON columnar batch, as forwarded before it)."""
    return _header(headers, FORMAT_HEADER) == ROWS


def _header(headers, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return value
    return None


def source_of(headers, partitions: int) -> int | None:
    """The source partition a repartition record names (None: not a valid one)."""
    raw = _header(headers, SOURCE_HEADER)
    if raw is None:
        return None
    try:
        source = int(raw)
    except (TypeError, ValueError):
        return None
    return source if 0 <= source < partitions else None


def positions_of(headers) -> np.ndarray | None:
    """(2, rows) source offsets and row numbers of a forwarded batch (None: missing or garbled)."""
    raw = _header(headers, POSITIONS_HEADER)
    if raw is None or len(raw) % 16:
        return None
    return np.frombuffer(raw, dtype="<i8").reshape(2, -1).astype(np.int64)


def source_positions(offsets: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Source positions as ordered integers (offset, then row in the message; -1 = a single report)."""
    return (offsets.astype(np.int64) << _ITEM_BITS) | (items.astype(np.int64) + 1)


def _marker_step(value: bytes) -> int | None:
    try:
        step = orjson.loads(value).get("step")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return step if type(step) is int and step >= 1 else None


class Inbox:
    """What a reports partition's owner has of its ``repartition`` partition, per source partition.

    ``through[q]``: the last step whose forwarded-through marker from q was handled; records from q
    after it belong to step interval ``through[q] + 1`` and are applied only while that interval is
    open here. ``applied[q]``: the largest source position from q applied (copies at or below it are
    skipped). Queued records are not applied yet; the checkpoint keeps ``resume`` (the smallest
    queued offset, else the next one), ``through`` and ``applied``.
    """

    def __init__(self, partitions: int, closed: int = 0):
        self.partitions = int(partitions)
        self.queues: list[deque] = [deque() for _ in range(self.partitions)]
        self.through = np.full(self.partitions, int(closed), dtype=np.int64)
        self.applied = np.full(self.partitions, -1, dtype=np.int64)
        self.consumed = -1  # offset of the last record enqueued (or handled before the checkpoint)

    def reset(self, closed: int) -> None:
        """Start over on a new log (the broker lost the old one): markers of closed steps are implied."""
        Inbox.__init__(self, self.partitions, closed)

    def enqueue(self, records: list) -> list:
        """Queue records (in log order, past ``consumed``) under their source; returns those naming no
        valid source (not written by a worker: the caller dead-letters them)."""
        bad = []
        for rec in records:
            if rec.offset <= self.consumed:
                continue
            self.consumed = rec.offset
            source = source_of(rec.headers, self.partitions)
            if source is None:
                bad.append(rec)
            else:
                self.queues[source].append(rec)
        return bad

    def take(self, closed: int) -> list[tuple[int, list]]:
        """Runs (source, records) that belong to the open interval (step ``closed`` + 1), removed from
        the queues; markers up to that step are handled on the way."""
        runs = []
        for source, queue in enumerate(self.queues):
            run = []
            while queue:
                rec = queue[0]
                if _header(rec.headers, CONTROL_HEADER) == FORWARDED:
                    step = _marker_step(rec.value)
                    if step is not None and step > self.through[source]:
                        if step > closed + 1:
                            break  # the source is an interval ahead: wait for this partition's close
                        self.through[source] = step
                elif self.through[source] + 1 > closed + 1:
                    break
                else:
                    run.append(rec)
                queue.popleft()
            if run:
                runs.append((source, run))
        return runs

    def ready(self, step: int) -> bool:
        """Every source has marked ``step`` as forwarded through (and what came before is applied)."""
        return bool((self.through >= step).all())

    def resume(self) -> int:
        heads = [q[0].offset for q in self.queues if q]
        return min(heads) if heads else self.consumed + 1

    def get_state(self) -> dict:
        return {
            "resume": self.resume(),
            "through": self.through.copy(),
            "applied": self.applied.copy(),
        }

    def set_state(self, state: dict) -> None:
        self.through = np.array(state["through"], dtype=np.int64)
        self.applied = np.array(state["applied"], dtype=np.int64)
        self.consumed = int(state["resume"]) - 1
        for queue in self.queues:
            queue.clear()
