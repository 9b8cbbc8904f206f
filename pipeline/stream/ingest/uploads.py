"""Uploads held by the workers until they are committed (``dpstream produce`` of a file).

An upload checks each chunk of its file and sends it at once, so a bad report late in the file is
found after earlier chunks are in the log. All or nothing still holds because the workers do not
apply an upload's messages when they read them: every message carries the header
``dpstream-upload: <id>``, and a worker *holds* such messages, per partition and upload, until the
upload's **end record** on that partition:

* ``dpstream-upload-end: commit`` with value ``{"upload": id, "messages": n}``, sent by the uploader
  to each partition once every one of its messages is acknowledged: the n held messages are applied
  at the commit's log position (a report of a step closed before the commit is ``late``, as any
  report). A partition holding another number of them dead-letters them all, ``uncommitted``;
* ``dpstream-upload-end: abort``: the held messages are dropped; the uploader has said that nothing
  of the file was accepted.

An upload whose end record never comes (the uploader was killed) is dead-lettered ``uncommitted``,
message by message, at the second close marker after its first message; until then its messages are
held, also across restarts (they are in the partition's checkpoint). Records without the header are
applied as they come, as before. Which reports count is still decided by log positions only (the
commit's, instead of each message's), so a replay from a checkpoint reproduces the same state, and
only the state at close enters a release: the privacy argument is unchanged (docs/privacy.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from pipeline.stream.process import limits

if TYPE_CHECKING:
    from pipeline.stream.ingest.reports import ReportParser

__all__ = [
    "EXPIRY_CLOSES",
    "MAX_UPLOAD_REPORTS",
    "UPLOAD_HEADER",
    "UPLOAD_END_HEADER",
    "SEQ_HEADER",
    "HeldUpload",
    "HeldUploads",
    "upload_headers",
    "end_record",
    "upload_of",
    "seq_of",
    "end_of",
    "end_count",
]

# a committed report's log position is (commit offset, rank in the upload on its partition), the
# rank in 24 bits (pipeline.stream.ingest.repartition): at most this many reports of one upload
# go to one partition (dpstream produce refuses a file with more)
MAX_UPLOAD_REPORTS = (1 << 24) - 1
# the fewest bytes a report takes in a message: in a columnar batch, its id's two quotes, one
# character and a comma; so an upload of fewer bytes than 4 * (MAX_UPLOAD_REPORTS + 1) held on a
# partition cannot hold more reports than its ranks number, and is not counted
_MIN_REPORT_BYTES = 4
UPLOAD_HEADER = "dpstream-upload"
UPLOAD_END_HEADER = "dpstream-upload-end"
SEQ_HEADER = "dpstream-upload-seq"
EXPIRY_CLOSES = 2  # an upload not ended by the second close after its first message is given up
_ENDS = (b"commit", b"abort")


def upload_headers(upload_id: str, seq: int | None = None) -> list[tuple[str, bytes]]:
    """The headers of a message of upload ``upload_id``: the id, and ``seq``, the message's number
    among the upload's messages to its partition (0, 1, ...): a copy stored twice by a retried send
    is then held once, and messages stored out of order are applied in order."""
    headers = [(UPLOAD_HEADER, upload_id.encode())]
    if seq is not None:
        headers.append((SEQ_HEADER, b"%d" % seq))
    return headers


def end_record(
    upload_id: str, messages: int, commit: bool
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """(value, headers) of the end record of ``upload_id`` on a partition it sent ``messages`` to."""
    value = orjson.dumps({"upload": upload_id, "messages": int(messages)})
    return value, [
        (UPLOAD_HEADER, upload_id.encode()),
        (UPLOAD_END_HEADER, b"commit" if commit else b"abort"),
    ]


def _header(headers, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return bytes(value) if value is not None else None
    return None


def upload_of(headers) -> str | None:
    """The upload id a record's headers name (None: not part of an upload)."""
    value = _header(headers, UPLOAD_HEADER)
    return value.decode("ascii", "replace") if value else None


def seq_of(headers) -> int | None:
    """A message's number in its upload's messages to its partition (None: not numbered)."""
    value = _header(headers, SEQ_HEADER)
    return int(value) if value and value.isdigit() and len(value) <= 18 else None


def end_of(headers) -> str | None:
    """``"commit"`` or ``"abort"`` for an end record, None otherwise (an unknown end value is None:
    the record is then held as an upload message and, never committed, dead-lettered)."""
    value = _header(headers, UPLOAD_END_HEADER)
    return value.decode() if value in _ENDS else None


def end_count(value: bytes | None) -> int | None:
    """The message count an end record's value states (None: no valid count)."""
    try:
        n = orjson.loads(value or b"")["messages"]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


@dataclass
class HeldUpload:
    """The messages of one upload a partition holds, in log order, and the close markers passed
    since the first of them."""

    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    headers: list[tuple] = field(default_factory=list)
    closes: int = 0

    size: int = 0  # bytes of the values
    numbers: dict[int, int] = field(default_factory=dict)  # seq -> index, of numbered messages

    def add(self, offset: int, value: bytes, headers) -> bool:
        """Hold a message; False for a copy of a numbered message held already (a retried send
        stored it twice: the same bytes)."""
        seq = seq_of(headers)
        if seq is not None:
            if seq in self.numbers:
                return False
            self.numbers[seq] = len(self.offsets)
        self.offsets.append(offset)
        self.values.append(bytes(value or b""))
        self.headers.append(tuple(headers or ()))
        self.size += len(self.values[-1])
        return True

    def complete(self, stated: int | None) -> bool:
        """Whether a commit stating ``stated`` messages finds them all: numbered 0..stated-1, or,
        unnumbered, as many."""
        if stated is None or len(self.offsets) != stated:
            return False
        return not self.numbers or (len(self.numbers) == stated and max(self.numbers) == stated - 1)

    def over_rank_limit(self, parser: ReportParser) -> bool:
        """Whether the upload holds more reports on this partition than a committed report's rank
        numbers (``MAX_UPLOAD_REPORTS``: ``dpstream produce`` never sends more; another uploader
        may): the reports ``parser`` (the workers') takes from the messages they parse (not those
        above ``MAX_REPORT_BYTES``, dead-lettered ``too_large`` unparsed), parsed only when those
        messages' bytes could hold that many (64 MiB or more)."""
        parsed = [v for v in self.values if len(v) <= limits.MAX_REPORT_BYTES]
        if sum(map(len, parsed)) < _MIN_REPORT_BYTES * (MAX_UPLOAD_REPORTS + 1):
            return False
        return len(parser.parse(parsed)) > MAX_UPLOAD_REPORTS

    def in_order(self) -> list[int]:
        """The held messages' indexes in the order they are applied: by number, else log order."""
        if not self.numbers:
            return list(range(len(self.offsets)))
        return [self.numbers[seq] for seq in sorted(self.numbers)]

    def get_state(self) -> dict[str, Any]:
        """For the checkpoint: the values as one byte buffer with their lengths (no per-message
        objects in the blob)."""
        return {
            "offsets": np.asarray(self.offsets, dtype=np.int64),
            "lengths": np.fromiter(map(len, self.values), dtype=np.int64, count=len(self.values)),
            "data": np.frombuffer(b"".join(self.values), dtype=np.uint8),
            "headers": [
                [[k, bytes(v or b"").decode("latin-1")] for k, v in h] for h in self.headers
            ],
            "closes": self.closes,
        }

    @classmethod
    def of_state(cls, state: dict[str, Any]) -> HeldUpload:
        data = np.asarray(state["data"], dtype=np.uint8).tobytes()
        ends = np.cumsum(np.asarray(state["lengths"], dtype=np.int64))
        starts = ends - np.asarray(state["lengths"], dtype=np.int64)
        held = cls(closes=int(state["closes"]))
        for offset, start, end, headers in zip(
            state["offsets"], starts.tolist(), ends.tolist(), state["headers"], strict=True
        ):
            held.add(
                int(offset), data[start:end], tuple((k, v.encode("latin-1")) for k, v in headers)
            )
        return held


class HeldUploads:
    """The uploads one partition holds, oldest first, and their total size."""

    def __init__(self, state: dict[str, Any] | None = None):
        self.uploads: dict[str, HeldUpload] = {
            u: HeldUpload.of_state(h) for u, h in (state or {}).items()
        }
        self.size = sum(h.size for h in self.uploads.values())

    def __len__(self) -> int:
        return len(self.uploads)

    def __iter__(self):
        return iter(list(self.uploads))

    def hold(self, upload: str, offset: int, value: bytes, headers) -> list[tuple[str, HeldUpload]]:
        """Hold a message; returns the oldest uploads given up (dead-lettered ``uncommitted`` by a
        worker) while the partition holds more than ``MAX_HELD_BYTES``, the newest kept."""
        held = self.uploads.setdefault(upload, HeldUpload())
        before = held.size
        held.add(offset, value, headers)
        self.size += held.size - before
        over = []
        while len(self.uploads) > 1 and self.size > limits.MAX_HELD_BYTES:
            oldest = next(iter(self.uploads))
            over.append((oldest, self.take(oldest)))
        return over

    def close(self) -> list[tuple[str, HeldUpload]]:
        """A close marker: returns the uploads it is the ``EXPIRY_CLOSES``-th close for since their
        first message, given up (dead-lettered ``uncommitted`` by a worker)."""
        expired = []
        for upload in list(self.uploads):
            self.uploads[upload].closes += 1
            if self.uploads[upload].closes >= EXPIRY_CLOSES:
                expired.append((upload, self.take(upload)))
        return expired

    def pop(self, upload: str) -> HeldUpload | None:
        held = self.uploads.pop(upload, None)
        if held is not None:
            self.size -= held.size
        return held

    def take(self, upload: str) -> HeldUpload:
        held = self.pop(upload)
        assert held is not None, upload
        return held

    def get_state(self) -> dict[str, Any]:
        return {u: h.get_state() for u, h in self.uploads.items()}

    def summary(self) -> dict[str, dict[str, int]]:
        """Per upload id: messages held and closes passed (``dpstream status``)."""
        return {
            u: {"messages": len(h.offsets), "closes": h.closes} for u, h in self.uploads.items()
        }
