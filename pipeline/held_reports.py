"""Which users the workers hold a report of for the open steps, read from the reports log: what
``dpstream produce --dry-run`` counts exact duplicates with (docs/own-data.md, "Dry run").

A worker holds a report of (user, step t) for an open step t when some report of that pair passed
the workers' parser and reached the user's owner while t was within its window (the next step to
close and ``steps.max_ahead`` after it); the first report wins and every later one is a
``duplicate`` (:meth:`pipeline.stream.ingest.partition_state.PartitionState.apply`). Which one
won does not matter here, only that one did. So the held pairs are found from the log alone,
without the workers' checkpoints (which the operator role may not read, docs/security.md):

* the window of a report is set by the close markers before it in the reports partition it was
  written to — for a report of another partition's user too, since its owner applies it in the
  interval the source's markers delimit (:class:`pipeline.stream.ingest.repartition.Inbox`);
* a report of an open step ``t >= closing + 1`` can only have been in its window after the marker
  of step ``closing - max_ahead``; an upload applied after it may have begun one close earlier
  (below), so each partition is read from the marker before that one (its offset is in the
  workers' intake history, :class:`pipeline.stream.ingest.partition_state.Intake`; from the log's
  start when the history does not have it) to the log's end, and reports read before the marker
  of ``closing - max_ahead`` are not parsed (their window holds closed steps only).

A close marker counts as a close, as it does for the workers, only when it is genuine: when its
partition's worker recorded it as its step's close (intake history: the workers' own verdict, which
also holds for a marker signed with a key since rotated out), or when its signature verifies with
the public keys the releaser publishes in the deployment descriptor
(:func:`pipeline.descriptor.close_verifier`: the workers' ``CloseVerifier``, the same keys and
fingerprint). A forged or unsigned marker, which the workers dead-letter as
``unauthenticated``, moves no window here either. And only when its step is one the releaser had
closed when read: a verified marker of a later step is a close after the dry run. Without a
descriptor carrying the keys (a releaser from before they were published) signatures are not
checked, and :attr:`HeldReports.note` says so.

Uploads (``dpstream produce`` of a file, :mod:`pipeline.stream.ingest.uploads`) are followed as
the workers follow them. A message with the ``dpstream-upload`` header is held, per partition and
upload, and counts only when its upload's commit record on the same partition is on the log when
read and states the number of messages of the upload held there; it then counts in the window at
the commit's position (a report of a step closed before the commit is ``late``). Held messages of
an aborted upload, of a commit that states another count (the workers dead-letter them
``uncommitted``), of an upload not committed by the second close after its first message, or of
the oldest uploads while a partition holds more than ``MAX_HELD_BYTES`` of them count for nothing;
end records are never reports.

The answer is exact for every report on the log when it is read, handled by the workers yet or
not; reports sent after it, and a close after it, are not foreseen (:attr:`HeldReports.note`).
Memory: a byte per roster user for each step asked about, 256 reports at a time, and the messages
of uploads read whose end record is not read yet (as the workers hold them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.stream.control.signatures import CloseVerifier
    from pipeline.stream.ingest.intake_view import IntakeView

__all__ = ["HeldReports", "held_reports", "published_verifier"]


@dataclass
class HeldReports:
    """Per open step asked about, the roster rows the workers hold (or will hold, once they have
    handled what is on the log now) an accepted report of."""

    closing: int  # the releaser's last closed step when read
    rows: dict[int, np.ndarray] = field(default_factory=dict)  # step -> bool per roster row
    records: int = 0  # records read
    # partitions read from the log's start for want of their marker's offset (slower, as exact)
    from_start: list[int] = field(default_factory=list)
    short: dict[int, int] = field(default_factory=dict)  # partition -> records not read (timeout)
    lost_log: bool = False  # the workers hold reports of a log the broker has lost
    # partition -> its first offset left, where the broker's retention deleted records that may
    # count (the workers hold them in their checkpoints)
    deleted: dict[int, int] = field(default_factory=dict)
    # why close markers' signatures were not checked (None: they were)
    unverified: str | None = None
    uncommitted: int = 0  # uploads on the log held without an end record when read

    def duplicates(self, step: int, sending: np.ndarray) -> int:
        """Reports of ``sending`` (bool per roster row: a report of the user for ``step``) the
        workers would dead-letter as ``duplicate``."""
        held = self.rows.get(step)
        return 0 if held is None else int(np.count_nonzero(held & sending))

    @property
    def note(self) -> str:
        """What the count covers, for the operator."""
        if self.lost_log:
            return (
                "a lower bound: the broker lost reports the workers hold (`dpstream status` "
                "shows LOST), and they are not on the log to count"
            )
        if self.deleted:
            return (
                "a lower bound: the log's retention deleted records of partitions "
                f"{sorted(self.deleted)} that the workers took before and hold in their checkpoints"
            )
        if self.short:
            missing = sum(self.short.values())
            return (
                f"a lower bound: {missing:,} records of the reports log were not read in time "
                f"(partitions {sorted(self.short)})"
            )
        whole = (
            f"; partitions {self.from_start} read from the log's start (their workers' history "
            "has no close marker offset)"
            if self.from_start
            else ""
        )
        unchecked = (
            f"; the close markers' signatures were not checked ({self.unverified}): a forged "
            "marker written before a real one would shift the count"
            if self.unverified is not None
            else ""
        )
        pending = (
            f"; {self.uncommitted:,} upload(s) on the log not committed yet are not counted (the "
            "workers hold them until their commit record)"
            if self.uncommitted
            else ""
        )
        return (
            f"exact for the {self.records:,} records on the reports log now (handled by the "
            "workers or not); reports sent after this and a close after this are not foreseen"
            + whole
            + unchecked
            + pending
        )


def held_reports(
    deployment: Deployment,
    broker: str,
    view: IntakeView,
    steps: set[int],
    roster,
    timeout: float = 300.0,
) -> HeldReports:
    """The held rows of ``steps`` (those that are open) from the reports log (module doc)."""
    from kafka import TopicPartition

    from pipeline.consumer import read_to_end
    from pipeline.stream.kafka.log_end import log_ends
    from pipeline.stream.kafka.topics import topic_names

    closing = view.closing
    max_ahead = deployment.steps.max_ahead
    wanted = sorted(t for t in steps if t > closing)
    held = HeldReports(closing, {t: np.zeros(roster.n, dtype=bool) for t in wanted})
    held.lost_log = bool(view.lost()) or any(view.stale.values())
    if not wanted:
        return held
    verifier, held.unverified = published_verifier(deployment, broker)
    topic = topic_names(deployment)["reports"]
    tps = [TopicPartition(topic, p) for p in range(deployment.topics.partitions)]
    ends = log_ends(broker, tps)
    start: dict = {}
    first = closing - max_ahead  # the first marker whose window may hold a step asked about
    for tp in tps:
        offset = _start_offset(view, tp.partition, first)
        if offset is not None:
            start[tp] = offset
        elif first >= 2:
            held.from_start.append(tp.partition)
    readers = {
        tp.partition: _PartitionReader(
            deployment,
            roster,
            held,
            _Closes(verifier, _recorded(view, tp.partition)),
            _Span(tp.partition, start.get(tp, 0), _marker_offset(view, tp.partition, first)),
        )
        for tp in tps
    }
    last = {tp.partition: start.get(tp, 0) - 1 for tp in tps}

    def handle(msg) -> None:
        readers[msg.partition].add(msg.value, msg.headers, msg.offset)
        last[msg.partition] = msg.offset
        held.records += 1

    read_to_end(broker, [topic], handle, timeout=timeout, start=start)
    for tp in tps:
        readers[tp.partition].flush()
        if last[tp.partition] + 1 < ends[tp]:
            held.short[tp.partition] = ends[tp] - last[tp.partition] - 1
    held.uncommitted = len(set().union(*(r.uploads for r in readers.values())))
    return held


def published_verifier(
    deployment: Deployment, broker: str
) -> tuple[CloseVerifier | None, str | None]:
    """The workers' check of close markers from the deployment descriptor, or None and why not."""
    from kafka.errors import KafkaError

    from pipeline import descriptor
    from pipeline.stream.kafka.topic_presence import TopicsMissing
    from pipeline.stream.kafka.topics import topic_names

    topic = topic_names(deployment)["deployment"]
    try:
        document = descriptor.published(broker, topic)
    except KafkaError as err:  # e.g. a Kafka whose ACLs predate the operator's read of it
        return None, f"cannot read {topic}: {err}"
    except TopicsMissing:
        return None, f"no topic {topic} on the broker"
    except ValueError as err:
        return None, f"the last record on {topic}: {err}"
    if document is None:
        return None, f"no deployment descriptor on {topic}"
    try:
        verifier = descriptor.close_verifier(document)
    except ValueError as err:
        return None, f"the descriptor on {topic}: {err}"
    if verifier is None:
        return None, f"the descriptor on {topic} has no close_keys (a releaser from before them)"
    return verifier, None


def _start_offset(view: IntakeView, partition: int, first: int) -> int | None:
    """Where ``partition`` is read from: the marker before step ``first``'s (an upload held past
    ``first``'s marker began after the one before: at the second it is dead-lettered), or
    ``first``'s when the worker's history lacks it; None: from the log's start."""
    before = _marker_offset(view, partition, first - 1) if first >= 2 else None
    if before is None and first >= 2:
        before = _marker_offset(view, partition, first)
    return before


def _marker_offset(view: IntakeView, partition: int, step: int) -> int | None:
    """Offset of the close marker of ``step`` in ``partition``'s log as its worker recorded it
    (None when it did not)."""
    closed = view.snapshots.get(partition, {}).get("history", {}).get(str(step), {})
    offset = closed.get("marker")
    return None if offset is None else int(offset)


def _recorded(view: IntakeView, partition: int) -> dict[int, int]:
    """Offset -> step of the close markers ``partition``'s worker closed its steps at."""
    history = view.snapshots.get(partition, {}).get("history", {})
    return {int(h["marker"]): int(t) for t, h in history.items() if h.get("marker") is not None}


@dataclass
class _Closes:
    """Which close markers of one partition are genuine (module doc)."""

    verifier: CloseVerifier | None
    recorded: dict[int, int]  # offset -> step, as the partition's worker closed it

    def before(self, offset: int, closing: int) -> int:
        """The last step the partition's worker closed at a marker before ``offset``, of those the
        releaser had closed (0: none recorded)."""
        return max((t for o, t in self.recorded.items() if o < offset and t <= closing), default=0)

    def step(self, value: bytes, offset: int) -> int | None:
        """The step the marker at ``offset`` closes (None: it closes nothing)."""
        from pipeline.stream.control.signatures import Unverified
        from pipeline.stream.kafka.messages import parse_close_marker

        step, _ = parse_close_marker(value)
        if self.verifier is None or step is None or self.recorded.get(offset) == step:
            return step
        try:
            return self.verifier.marker(value).step
        except Unverified:
            return None  # the workers dead-letter it


@dataclass(frozen=True)
class _Span:
    """Where one partition's read begins, and the marker after which its reports may count."""

    partition: int
    start: int  # offset the read starts at (a marker's, or 0)
    counted_from: int | None  # offset of the first marker whose window holds an open step


class _PartitionReader:
    """One reports partition's records in log order: reports are parsed by the workers' parser a
    run at a time, and those in their window mark their (user, step). Before the first marker read
    nothing is closed: a partition is read from a marker, or from the log's start. An upload's
    messages are held until its end record, as the workers hold them (module doc).

    The durable log's retention (:mod:`pipeline.stream.local.retention`) deletes records up to a
    close the workers have checkpointed, the first marker to read too: the last step closed before
    the first record left is then the one the workers' history records, and the count is a lower
    bound (:attr:`HeldReports.deleted`) when records that may count were deleted."""

    RUN = 256  # records parsed at a time (a window never changes inside a run)

    def __init__(
        self, deployment: Deployment, roster, held: HeldReports, closes: _Closes, span: _Span
    ):
        from pipeline.stream.ingest.reports import ReportParser
        from pipeline.stream.ingest.uploads import HeldUploads

        self.parser = ReportParser(roster, deployment.attributes, deployment.horizon)
        self.closes = closes
        self.max_ahead = deployment.steps.max_ahead
        self.held = held
        self.closed = 0  # last closed step at the records read
        self.run: list[bytes] = []
        self.uploads = HeldUploads()  # the uploads' messages not yet ended, oldest upload first
        self.span = span
        self.trimmed: bool | None = None  # whether records before the first read were deleted

    def add(self, value: bytes | None, headers, offset: int) -> None:
        from pipeline.stream.ingest.core import is_marker
        from pipeline.stream.ingest.uploads import upload_of

        if self.trimmed is None:
            self._begin(offset)
        if headers and is_marker(headers):
            step = self.closes.step(value or b"", offset)
            # a genuine marker of a step the releaser had not closed when read: a close after
            # the dry run
            if step is not None and self.closed < step <= self.held.closing:
                self.flush()
                self.closed = step
                self._expire()
            return
        upload = upload_of(headers) if headers else None
        if upload is not None:
            self._upload(upload, value, headers, offset)
        else:
            self._report(value)

    def _begin(self, offset: int) -> None:
        """The first record read, at ``offset``: records before it, from the start asked for, were
        deleted by the log's retention."""
        span = self.span
        self.trimmed = offset > span.start
        if not self.trimmed:
            return
        self.closed = self.closes.before(offset, self.held.closing)
        if span.counted_from is None or offset > span.counted_from + 1:
            self._lost(offset)  # reports that may be in an open step's window

    def _lost(self, offset: int) -> None:
        self.held.deleted.setdefault(self.span.partition, offset)

    def _report(self, value: bytes | None) -> None:
        """A report read now (or an upload's, at its commit): into the run unless it is too large
        (dead-lettered) or no step asked about is in the window."""
        from pipeline.stream.process.limits import MAX_REPORT_BYTES

        if self.closed + 1 + self.max_ahead <= self.held.closing:
            return  # the window holds closed steps only
        if value is not None and len(value) <= MAX_REPORT_BYTES:
            self.run.append(value)
            if len(self.run) >= self.RUN:
                self.flush()

    def _upload(self, upload: str, value: bytes | None, headers, offset: int) -> None:
        """A record of an upload, as the workers take it (:class:`IngestCore`): a message is held
        (the oldest uploads dropped while the partition holds more than ``MAX_HELD_BYTES``); a
        commit stating the number held releases them as reports at its position, any other end
        drops them."""
        from pipeline.stream.ingest.uploads import end_count, end_of

        end = end_of(headers)
        if end is None:
            # the uploads given up beside it count nothing (the workers dead-letter them)
            self.uploads.hold(upload, offset, value or b"", headers)
            return
        held = self.uploads.pop(upload)
        stated, read = end_count(value), 0 if held is None else len(held.values)
        if held is not None and end == "commit" and held.complete(stated):
            if held.over_rank_limit(self.parser):
                return  # more reports than ranks: the workers dead-letter it whole
            for i in held.in_order():
                self._report(held.values[i])
        elif end == "commit" and self.trimmed and stated is not None and stated > read:
            self._lost(offset)  # the rest of its messages may have been deleted

    def _expire(self) -> None:
        """A close: uploads it is the second close for are dead-lettered ``uncommitted``."""
        self.uploads.close()

    def flush(self) -> None:
        """Mark the held pairs of the run read so far."""
        if not self.run:
            return
        parsed = self.parser.parse(self.run)
        self.run = []
        closed = self.closed
        in_window = (parsed.steps > closed) & (parsed.steps <= closed + 1 + self.max_ahead)
        for step, rows in self.held.rows.items():
            rows[parsed.rows[in_window & (parsed.steps == step)]] = True
