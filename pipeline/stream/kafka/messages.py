"""Message formats on the topics, with deterministic keys so consumers can deduplicate (the topics
themselves — partitions, public or not, who reads them — are declared in :mod:`pipeline.stream.kafka.topics`).

Public topics carry JSON an analyst can read as ordinary data:

* ``releases``  key ``<release>:<step>`` — the step's manifest: mechanism and parameters, noisy and
  projected counts, the synthetic values' chunk count and SHA-256 (:mod:`pipeline.releases.codecs`),
  privacy spent so far.
* ``synthetic`` key ``<release>:<step>:<chunk>`` — new values of synthetic records
  ``[start, stop)`` for the step's new columns: ``{"values": {"<column step>": [...]}}``. A
  relative-error release uses the same format for its histogram: records = codes, float64 values
  (``pipeline.releases.relative_error``).
* ``alerts``    key ``<release>:<step>`` — heavy hitters / band alerts of the step.

Internal topics (curator-side, never exposed):

* ``reports``   user reports; a close marker is a message with header ``dpstream-control: close``
  and value ``{"step": t, "closed_at": ms}``, written to **every** partition, so the cut between
  step t and later reports is a position in each partition's log. ``closed_at`` is the step's
  public close time (the close command's timestamp or the deadline), carried through the partials
  to stamp every public record of the step (docs/privacy.md, "Closing rules and timing").
* ``control``   operator commands (``{"command": "close", "step": t}``), turned into markers.
* ``step-partials`` binary partial aggregates (true counts), chunked, key ``<step>:<partition>:<chunk>``.
* ``feedback``  ``{"release", "step", "flagged": [...]}`` to every partition (heavy-hitter charging).
* ``repartition`` reports that arrived on a partition not owning their user, as batches of packed
  rows (roster row, step, codes) for the owner's partition, and per-step forwarded-through markers
  (:mod:`pipeline.stream.ingest.repartition`).
* ``dead-letter`` the original bytes as value; reason, detail and source position in headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from pipeline.releases.codecs import SYNTHETIC_CHUNK_RECORDS
from pipeline.serialization import dumps_state, loads_state

__all__ = [
    "CONTROL_HEADER",
    "REPORTS_HEADER",
    "PARTIAL_CHUNK_BYTES",
    "synthetic_chunks",
    "encode_partial",
    "PartialAssembler",
    "dead_letter_headers",
    "close_marker",
    "parse_close_marker",
]

CONTROL_HEADER = "dpstream-control"
PARTIAL_CHUNK_BYTES = 512 * 1024  # below Kafka's default 1 MB message limit


def synthetic_chunks(
    release: str,
    step: int,
    column_steps: list[int],
    columns: np.ndarray,
    chunk_records: int = SYNTHETIC_CHUNK_RECORDS,
) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) messages for the new columns (shape (m, len(column_steps))) of one step.

    The JSON of each chunk is ``orjson.dumps`` of ``{"release", "step", "chunk", "chunks", "start",
    "stop", "values": {"<column step>": [...]}}``. Codes of an alphabet of at most 10 values (binary
    attributes: most synthetic records) have their lists written by :func:`_digit_lists`, byte for
    byte what orjson writes, without building a Python int per value (~10⁶ per column per step)."""
    m = columns.shape[0]
    chunks = max(1, -(-m // chunk_records))
    digits = (
        columns.dtype.kind in "iu" and columns.size and columns.min() >= 0 and columns.max() <= 9
    )
    lists = [_digit_lists(columns[:, j]) for j in range(len(column_steps))] if digits else None
    for c in range(chunks):
        start, stop = c * chunk_records, min(m, (c + 1) * chunk_records)
        head = {
            "release": release,
            "step": step,
            "chunk": c,
            "chunks": chunks,
            "start": start,
            "stop": stop,
        }
        if lists is None:
            head["values"] = {
                str(s): columns[start:stop, j].tolist() for j, s in enumerate(column_steps)
            }
            body = orjson.dumps(head)
        else:
            values = b",".join(
                b'"%d":[%s]' % (s, text[2 * start : 2 * stop - 1])
                for s, text in zip(column_steps, lists)
            )
            body = orjson.dumps(head)[:-1] + b',"values":{' + values + b"}}"
        yield f"{release}:{step}:{c}".encode(), body


def _digit_lists(values: np.ndarray) -> bytes:
    """Single-digit values 0..9 as ``b"0,1,1,...,"``: value i is byte 2i, a comma after each."""
    text = np.full(2 * values.size, ord(","), dtype=np.uint8)
    text[0::2] = values.astype(np.uint8) + ord("0")
    return text.tobytes()


def encode_partial(
    partial: dict[str, Any], chunk_bytes: int = PARTIAL_CHUNK_BYTES
) -> list[tuple[bytes, bytes]]:
    """Chunked binary messages for one partition's partial aggregate of one step."""
    blob = dumps_state(partial)
    step, partition = int(partial["step"]), int(partial["partition"])
    pieces = [blob[i : i + chunk_bytes] for i in range(0, len(blob), chunk_bytes)] or [b""]
    out = []
    for c, piece in enumerate(pieces):
        header = dumps_state(
            {
                "step": step,
                "partition": partition,
                "chunk": c,
                "chunks": len(pieces),
                "data": np.frombuffer(piece, dtype=np.uint8),
            }
        )
        out.append((f"{step}:{partition}:{c}".encode(), header))
    return out


class PartialAssembler:
    """Collects partial chunks (duplicates allowed) until a step has every partition's partial."""

    def __init__(self, partitions: int):
        self.partitions = int(partitions)
        self._chunks: dict[tuple[int, int], dict[int, bytes]] = {}
        self._expected: dict[tuple[int, int], int] = {}
        self._offsets: dict[tuple[int, int], int] = {}  # smallest log offset of a buffered chunk

    def add(self, value: bytes, offset: int = -1) -> int:
        """Add one message (``offset``: its position in the partials log); returns its step."""
        msg = loads_state(value)
        key = (int(msg["step"]), int(msg["partition"]))
        if offset >= 0:
            self._offsets[key] = min(offset, self._offsets.get(key, offset))
        self._chunks.setdefault(key, {})[int(msg["chunk"])] = msg["data"].tobytes()
        self._expected[key] = int(msg["chunks"])
        return key[0]

    def complete(self, step: int) -> bool:
        return all(
            len(self._chunks.get((step, p), {})) == self._expected.get((step, p), -1)
            for p in range(self.partitions)
        )

    def pop(self, step: int) -> list[dict[str, Any]]:
        """The step's partials, one per partition, in partition order (removed from the buffer)."""
        if not self.complete(step):
            raise KeyError(f"step {step} is not complete")
        out = []
        for p in range(self.partitions):
            chunks = self._chunks.pop((step, p))
            self._expected.pop((step, p))
            self._offsets.pop((step, p), None)
            out.append(loads_state(b"".join(chunks[c] for c in range(len(chunks)))))
        return out

    def discard_before(self, step: int) -> None:
        for key in [k for k in self._chunks if k[0] < step]:
            self._chunks.pop(key, None)
            self._expected.pop(key, None)
            self._offsets.pop(key, None)

    def min_offset(self) -> int | None:
        """Smallest log offset of a buffered (unreleased) chunk: where a restart must re-read from."""
        return min(self._offsets.values()) if self._offsets else None


def close_marker(step: int, closed_at_ms: int) -> bytes:
    """The value of the close marker of ``step``, closed at the public time ``closed_at_ms``."""
    return orjson.dumps({"step": int(step), "closed_at": int(closed_at_ms)})


def parse_close_marker(value: bytes) -> tuple[int | None, int | None]:
    """(step, closed_at ms) of a close marker; step None when the value is not ``{"step": <int ≥ 1>}``,
    closed_at None when absent or not a non-negative integer."""
    try:
        msg: Any = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None, None
    if type(msg) is not dict:
        return None, None
    step, closed_at = msg.get("step"), msg.get("closed_at")
    return (
        step if type(step) is int and step >= 1 else None,
        closed_at if type(closed_at) is int and closed_at >= 0 else None,
    )


REPORTS_HEADER = "dpstream-reports"  # a dead letter of a whole message: the reports it holds


def dead_letter_headers(
    reason: str,
    detail: str,
    topic: str,
    partition: int,
    offset: int,
    batch_index: int | None,
    reports: int = 1,
) -> list[tuple[str, bytes]]:
    headers = [
        ("dpstream-reason", reason.encode()),
        ("dpstream-detail", detail.encode()[:1000]),
        ("dpstream-source", f"{topic}/{partition}/{offset}".encode()),
    ]
    if batch_index is not None:
        headers.append(("dpstream-batch-index", str(batch_index).encode()))
    if reports != 1:
        headers.append((REPORTS_HEADER, str(reports).encode()))
    return headers
