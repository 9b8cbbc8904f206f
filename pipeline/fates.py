"""What became of the reports one ``dpstream produce`` sent: accepted by the workers, or
dead-lettered and why (curator side: docs/own-data.md, "What produce tells you").

The broker's acknowledgement says a report is stored, not that the workers took it: a report
for a step that closed meanwhile is ``late``, a second report of a (user, step) a ``duplicate``.
Whatever sends the reports (one JSON message per report, or batch messages of many) hands a
:class:`Receipt`: the (partition, offset) of every acknowledged message of the ``reports`` topic
and how many reports it carries. The workers file every rejection under its source position:
a dead letter's ``dpstream-source`` header names (topic, partition, offset) and
``dpstream-batch-index`` the item of a batch message, also for a report forwarded to the partition
that owns its user (:mod:`pipeline.stream.ingest.core`); a letter without it stands for the whole
message (one whose every report one check rejected, or an ``uncommitted`` one). So the reports of this producer are
told apart from everyone else's by position alone, and nothing is matched on the private values.

:func:`await_fates` waits (bounded) until the workers have handled those positions — each
partition's intake snapshot, written only after its dead letters were acknowledged
(:mod:`pipeline.stream.ingest.coordinator`), covers the last offset sent there, then the
``repartition`` log is handled to the end it had then — and reads the dead letters written since
:func:`dead_letter_mark`. A report is *accepted* when its message was handled and no dead letter
names it; *unknown* when no worker had handled its message when the wait ended.

Not attributed: a report accepted, then displaced by a report of the same (user, step) forwarded
from a lower partition (its dead letter names the displacing partition, not a source position).
Reports sent to the partition that owns their user, as ``produce`` sends them, are never displaced.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.stream.state.store import StateStore

__all__ = ["Receipt", "Fates", "dead_letter_mark", "await_fates", "poll_delays"]

# the dead-letter headers (pipeline.stream.kafka.messages.dead_letter_headers)
SOURCE_HEADER, ITEM_HEADER = "dpstream-source", "dpstream-batch-index"
REASON_HEADER = "dpstream-reason"


class Receipt:
    """The acknowledged messages of one send: per partition of ``topic``, offsets and report
    counts (8 bytes each, so a 10^6-message send keeps ~16 MB); for an upload, also its commit
    records (:mod:`pipeline.upload_send`), with no reports: the workers apply the upload's messages
    before a commit on its partition at the commit's offset, so they are handled only once the
    commit is."""

    def __init__(self, topic: str):
        self.topic = topic
        self._offsets: dict[int, array] = {}
        self._counts: dict[int, array] = {}
        self._commits: dict[int, array] = {}

    def add(self, partition: int, offset: int, reports: int = 1) -> None:
        self._offsets.setdefault(partition, array("q")).append(int(offset))
        self._counts.setdefault(partition, array("q")).append(int(reports))

    def add_commit(self, partition: int, offset: int) -> None:
        """An upload's commit record on ``partition`` (0 reports)."""
        self.add(partition, offset, 0)
        self._commits.setdefault(partition, array("q")).append(int(offset))

    @property
    def reports(self) -> int:
        return int(sum(sum(c) for c in self._counts.values()))

    def last_offsets(self) -> dict[int, int]:
        return {p: max(offs) for p, offs in self._offsets.items() if offs}

    def table(self, partition: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets ascending, report counts) of the partition's messages."""
        offs = np.frombuffer(self._offsets.get(partition, array("q")), dtype=np.int64)
        counts = np.frombuffer(self._counts.get(partition, array("q")), dtype=np.int64)
        order = np.argsort(offs, kind="stable")
        return offs[order], counts[order]

    def reports_after(self, handled: dict[int, int]) -> int:
        """Reports in messages past ``handled`` (partition -> last offset a worker handled); a
        message before a commit record counts as handled when the commit is."""
        total = 0
        for p in self._offsets:
            offs, counts = self.table(p)
            total += int(counts[self._applied_at(p, offs) > handled.get(p, -1)].sum())
        return total

    def _applied_at(self, partition: int, offsets: np.ndarray) -> np.ndarray:
        """Where the workers apply the messages at ``offsets``: at the first commit record at or
        after each (an upload's), else where it is."""
        commits = np.sort(np.frombuffer(self._commits.get(partition, array("q")), dtype=np.int64))
        if not commits.size:
            return offsets
        after = np.searchsorted(commits, offsets)
        return np.where(after < commits.size, commits[np.minimum(after, commits.size - 1)], offsets)

    def counts_at(self, partition: int, offsets: np.ndarray) -> np.ndarray:
        """Reports of the messages at ``offsets`` of ``partition`` (0 where this send has none)."""
        sent, counts = self.table(partition)
        if not sent.size:
            return np.zeros(offsets.size, dtype=np.int64)
        at = np.minimum(np.searchsorted(sent, offsets), sent.size - 1)
        return np.where(sent[at] == offsets, counts[at], 0)


@dataclass
class Fates:
    """The workers' verdict on one send's reports."""

    sent: int
    rejected: dict[str, int] = field(default_factory=dict)
    unknown: int = 0  # reports in messages no worker had handled when the wait ended
    waited: float = 0.0
    unapplied_forwards: bool = False  # the repartition log was not handled to its end in time

    @property
    def accepted(self) -> int:
        return self.sent - self.unknown - sum(self.rejected.values())

    def summary(self) -> str:
        by_count = sorted(self.rejected.items(), key=lambda kv: (-kv[1], kv[0]))
        reasons = ", ".join(f"{r} {n:,}" for r, n in by_count)
        rejected = sum(self.rejected.values())
        text = (
            f"workers' verdict on the {self.sent:,} reports sent: {self.accepted:,} accepted, "
            f"{rejected:,} rejected" + (f" ({reasons})" if reasons else "")
        )
        if self.unknown:
            text += f", {self.unknown:,} not handled yet"
        elif self.unapplied_forwards:
            text += " (some forwarded between partitions not applied yet)"
        return text


def dead_letter_mark(broker: str, topic: str, partitions: int) -> dict:
    """The dead-letter log's true ends now: what a send's dead letters will come after."""
    from kafka import TopicPartition

    from pipeline.stream.kafka.log_end import log_ends

    return log_ends(broker, [TopicPartition(topic, p) for p in range(partitions)])


def poll_delays(fast_for: float = 2.0, fast: float = 0.05, slow: float = 0.2) -> Iterator[float]:
    """The sleeps between two reads of the workers' intake snapshots (Redis, not the broker):
    10 ms doubling up to ``fast`` for the first ``fast_for`` seconds of sleeping, ``slow`` after.
    A verdict that is there a moment after a read is seen ~10 ms later instead of after a fixed
    200 ms; a long wait reads no more often than before (``slow``)."""
    delay, slept = 0.01, 0.0
    while slept < fast_for:
        yield delay
        slept += delay
        delay = min(fast, delay * 2)
    while True:
        yield slow


def await_fates(
    store: StateStore,
    broker: str,
    names: dict[str, str],
    partitions: int,
    receipt: Receipt,
    mark: dict,
    timeout: float,
    progress: Callable[[int, int], None] | None = None,
) -> Fates:
    """Wait up to ``timeout`` seconds for the workers to handle ``receipt``'s messages, then
    count its reports' dead letters (written after ``mark``) by reason.

    One log-end probe serves the wait for forwarded reports and the dead-letter log's end; it
    connects (TLS to the embedded broker's gate) in a thread while the snapshots are read. The
    dead letters are read only when that log grew past ``mark``: a worker acknowledges a
    partition's dead letters before its snapshot covers them, so a log that did not grow holds
    none of this send's."""
    from pipeline.background import in_daemon_thread
    from pipeline.stream.kafka.log_end import LogEnds

    start = time.monotonic()
    deadline = start + timeout
    last = receipt.last_offsets()
    total = receipt.reports
    made = in_daemon_thread(lambda: LogEnds(broker), "verdict-probe")
    try:
        delays = poll_delays()
        while True:
            snaps = store.intake()
            handled = {p: int(snaps[p]["offset"]) if p in snaps else -1 for p in last}
            left = receipt.reports_after(handled)
            if progress is not None:
                progress(total - left, total)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(next(delays))
        probe = made.result()
    except BaseException:  # Ctrl-C: closed when made, not waited for
        made.add_done_callback(_close_made)
        raise
    try:
        applied = not left and _forwards_applied(
            store, probe, names["repartition"], partitions, deadline
        )
        fates = Fates(sent=total, unknown=left, unapplied_forwards=not left and not applied)
        grown = _grown_past(probe, mark)
    finally:
        probe.close()
    fates.rejected = (
        _rejections(broker, names["dead-letter"], names["reports"], receipt, mark, handled)
        if grown
        else {}
    )
    fates.waited = time.monotonic() - start
    return fates


def _close_made(made: Future) -> None:
    if made.exception() is None:
        made.result().close()


def _grown_past(probe, mark: dict) -> bool:
    """Whether any partition of ``mark`` (TopicPartition -> end offset) has records past it."""
    if not mark:
        return True  # nothing to compare with: read
    ends = probe(list(mark))
    return any(ends[tp] > end for tp, end in mark.items())


def _forwards_applied(
    store: StateStore, probe, topic: str, partitions: int, deadline: float
) -> bool:
    """Wait until every owner has handled the ``repartition`` log to its end now (the reports
    other partitions forwarded to it); False if not by ``deadline``. ``probe``: a
    :class:`pipeline.stream.kafka.log_end.LogEnds`."""
    from kafka import TopicPartition

    ends = probe([TopicPartition(topic, p) for p in range(partitions)])
    delays = poll_delays()
    while True:
        snaps = store.intake()
        behind = [
            tp
            for tp, end in ends.items()
            if "forwarded_offset" in snaps.get(tp.partition, {})
            and int(snaps[tp.partition]["forwarded_offset"]) + 1 < end
        ]
        if not behind:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(next(delays))


def _rejections(
    broker: str,
    dead_letter_topic: str,
    reports_topic: str,
    receipt: Receipt,
    mark: dict,
    handled: dict[int, int],
) -> dict[str, int]:
    """Reason -> reports of ``receipt`` in the dead letters past ``mark``. A dead letter replayed
    (a worker's restart repeats it: same position) counts once; one of a whole batch message
    counts all its reports."""
    from pipeline.consumer import read_to_end

    whole: dict[tuple[int, int], str] = {}  # (partition, offset) -> reason of a whole message
    items: dict[tuple[int, int, int], str] = {}  # (partition, offset, item) -> reason
    prefix = f"{reports_topic}/"

    def handle(msg) -> None:
        headers = dict(msg.headers or ())
        source = headers.get(SOURCE_HEADER, b"").decode(errors="replace")
        try:
            partition, offset = map(int, source[len(prefix) :].split("/"))
        except ValueError:
            return
        # positions past what was handled count as unknown; offset -1: a displaced report
        if not source.startswith(prefix) or not 0 <= offset <= handled.get(partition, -1):
            return
        reason = headers.get(REASON_HEADER, b"?").decode(errors="replace")
        item = headers.get(ITEM_HEADER)
        if item is None:
            whole[(partition, offset)] = reason
        else:
            items[(partition, offset, int(item))] = reason

    read_to_end(broker, [dead_letter_topic], handle, timeout=120.0, start=mark)
    for key in [k for k in items if k[:2] in whole]:  # the whole message is counted already
        del items[key]
    letters = [(p, off, 0, reason) for (p, off), reason in whole.items()]
    letters += [(p, off, 1, reason) for (p, off, _), reason in items.items()]
    out: dict[str, int] = {}
    for p in {letter[0] for letter in letters}:
        mine = [letter for letter in letters if letter[0] == p]
        offsets = np.array([letter[1] for letter in mine], dtype=np.int64)
        counts = receipt.counts_at(p, offsets)
        one = np.array([letter[2] for letter in mine], dtype=bool)
        counted = np.where(one, np.minimum(counts, 1), counts)  # an item: one report of its message
        for (_, _, _, reason), n in zip(mine, counted.tolist()):
            if n:
                out[reason] = out.get(reason, 0) + n
    return out
