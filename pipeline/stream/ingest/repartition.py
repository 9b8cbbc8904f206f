"""Reports from any producer: a report that arrives on a partition not owning its user is routed to
the owner through the ``repartition`` topic, with the guarantees of a direct report.

A user is owned by reports partition murmur2(user id) mod P (:mod:`pipeline.stream.ingest.roster`), which
is where the Java client, kafka-python and aiokafka put a report keyed by user id. librdkafka's
clients (confluent-kafka, kcat, the Go/.NET/Node clients) hash keys with CRC32 by default, and a
producer may send null keys or pick partitions at random: the user id in the value is what counts.

Protocol (docs/streaming.md, "Reports from any producer"):

* **Source side.** A worker handling reports partition q parses a run of reports; the rows of users
  owned elsewhere are sent, grouped by owner p, as columnar batches to partition p of
  ``repartition`` (headers: the source partition, and each row's source position — offset and row
  in its message). When it reaches the close marker of step s in q, it first waits until the broker
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

from pipeline.stream.kafka.codecs import CONTROL_HEADER

__all__ = ["SOURCE_HEADER", "POSITIONS_HEADER", "FORWARDED", "FORWARD_CHUNK", "Forwarder", "ForwardMarkers",
           "Inbox", "source_of", "positions_of", "source_positions"]

SOURCE_HEADER = "dpstream-from"  # the reports partition a forwarded record comes from
POSITIONS_HEADER = "dpstream-positions"  # per row: its offset in the source partition, then its row there
FORWARDED = b"forwarded-through"  # CONTROL_HEADER value of the per-step marker
FORWARD_CHUNK = 5000  # rows per forwarded batch (~150 KB), well below Kafka's 1 MB message limit
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
    """Encodes the foreign rows of a run of reports as columnar batches for their owners."""

    def __init__(self, roster, attributes: dict, partitions: int):
        self.partitions = int(partitions)
        self.owners = roster.owners(self.partitions)
        self.ids = np.asarray(roster.ids, dtype=object)
        self.labels = {name: np.asarray(attr.values, dtype=object) if attr.type == "categorical" else None
                       for name, attr in attributes.items()}

    def forward(self, source: int, offsets: np.ndarray, parsed) -> list[tuple[int, bytes, list]]:
        """(owner partition, value, headers) for the parsed reports ``parsed`` (users of other
        partitions); ``offsets[i]`` is the source offset of parsed message i."""
        owner = self.owners[parsed.rows]
        out = []
        for p in np.unique(owner):
            sel = np.flatnonzero(owner == p)
            for start in range(0, sel.size, FORWARD_CHUNK):
                rows = sel[start: start + FORWARD_CHUNK]
                steps = parsed.steps[rows]
                columns = {"user": self.ids[parsed.rows[rows]].tolist(),
                           "step": int(steps[0]) if (steps == steps[0]).all() else steps.tolist()}
                for name, codes in parsed.codes.items():
                    columns[name] = self._column(name, codes[rows])
                positions = np.stack([offsets[parsed.message[rows]], parsed.batch_index[rows]]).astype("<i8")
                headers = [(SOURCE_HEADER, str(source).encode()), (POSITIONS_HEADER, positions.tobytes())]
                out.append((int(p), orjson.dumps({"columns": columns}), headers))
        return out

    def _column(self, name: str, codes: np.ndarray) -> list:
        """Values the owner's parser reads back as the same codes (categorical: labels); null = not reported."""
        labels = self.labels[name]
        values = labels[np.maximum(codes, 0)] if labels is not None else codes.astype(object)
        if (codes >= 0).all():
            return values.tolist()
        return np.where(codes >= 0, values, None).tolist()

    def markers(self, source: int, step: int) -> ForwardMarkers:
        value = orjson.dumps({"step": int(step), "from": int(source)})
        headers = [(CONTROL_HEADER, FORWARDED), (SOURCE_HEADER, str(source).encode())]
        return ForwardMarkers(source, step, [(p, value, headers) for p in range(self.partitions)])


def _header(headers, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return value
    return None


def source_of(headers, partitions: int) -> int | None:
    """The source partition a repartition record names (None: not a valid one)."""
    raw = _header(headers, SOURCE_HEADER)
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
        self.__init__(self.partitions, closed)

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
        return {"resume": self.resume(), "through": self.through.copy(), "applied": self.applied.copy()}

    def set_state(self, state: dict) -> None:
        self.through = np.array(state["through"], dtype=np.int64)
        self.applied = np.array(state["applied"], dtype=np.int64)
        self.consumed = int(state["resume"]) - 1
        for queue in self.queues:
            queue.clear()
