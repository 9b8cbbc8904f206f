"""Ingest logic of a worker, independent of the transport (pipeline/stream/ingest/coordinator.py drives it).

A worker owns some partitions of ``reports``. For each it keeps a :class:`PartitionState`
(restored from the partition's Redis checkpoint when assigned). Records of a partition are handled
in log order: runs of reports are parsed and applied in bulk (vectorised), and a close marker for
step t closes the step: imputation, partial aggregates, a checkpoint holding the state and the
marker's offset. After a crash the partition is replayed from the checkpoint's offset; since the
state is restored to exactly that point and the cut is a log position, the replay reproduces the
same partials (the releaser deduplicates them) and every accepted report counts exactly once.

The partial messages of the closed steps not known to be released (at most the last
``KEEP_PARTIALS``) are kept beside the checkpoint (each written once, with the checkpoint of its
close, not again with every later checkpoint). A marker for a step the partition has already closed
(the releaser re-drives the closes it has not released: the broker may have lost the partials)
re-sends the kept partial, byte for byte, and the forwarded-through markers of that step; nothing is
recomputed (docs/streaming.md, "A lost close"). A feedback message of step s proves step s released:
the releaser publishes it only after committing the step to Redis, and re-drives only the steps
after the last one committed, so the partials of steps up to s are dropped (with a heavy-hitter
release a worker keeps one step's partial at most: the last closed step's, until its feedback).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import orjson

from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.control.signatures import CloseVerifier, Unverified
from pipeline.stream.ingest import uploads
from pipeline.stream.ingest.corrections import REPLACE_HEADER, is_replacement
from pipeline.stream.ingest.partition_state import OwnedRows, PartitionState
from pipeline.stream.ingest.repartition import (
    Forwarder,
    ForwardMarkers,
    Inbox,
    is_rows,
    positions_of,
    source_positions,
)
from pipeline.stream.ingest.reports import ReportParser
from pipeline.stream.ingest.uploads import (
    HeldUpload,
    HeldUploads,
    end_count,
    end_of,
    upload_of,
)
from pipeline.stream.kafka.messages import (
    CONTROL_HEADER,
    dead_letter_headers,
    encode_partial,
    parse_close_marker,
)
from pipeline.stream.process import limits
from pipeline.stream.process.limits import DEAD_LETTER_COPY_BYTES, MAX_REPORT_BYTES

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["IngestCore", "Record", "ApplyResult", "CloseOutput", "is_marker"]

log = logging.getLogger("dpstream.worker")
_VALUE, _HEADERS, _OFFSET = attrgetter("value"), attrgetter("headers"), attrgetter("offset")


@dataclass(frozen=True)
class Record:
    offset: int
    value: bytes
    headers: tuple = ()


def is_marker(headers) -> bool:
    return any(key == CONTROL_HEADER and value == b"close" for key, value in headers or ())


@dataclass
class CloseOutput:
    """A closed step: publish ``messages`` (and wait for the broker's ack), then store ``checkpoint``
    with the kept partials to write (``kept``: step -> blob) and to delete (``dropped``: steps)."""

    partition: int
    step: int
    messages: list[tuple[bytes, bytes]]
    checkpoint: bytes
    summary: dict
    kept: dict[int, bytes] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)


@dataclass
class ApplyResult:
    partition: int = -1
    accepted: int = 0
    dead_letters: list[tuple[bytes, bytes, list]] = field(
        default_factory=list
    )  # (key, value, headers)
    reasons: dict[str, int] = field(default_factory=dict)
    forwards: list[tuple[int, bytes, list]] = field(
        default_factory=list
    )  # (repartition partition, value, headers)
    forwarded: int = 0  # reports of users owned elsewhere, in ``forwards``
    ranked: int = 0  # reports of a committed upload given positions (IngestCore.apply_reports)


class IngestCore:
    REWIND_GRACE_SECONDS = 10.0  # see enqueue
    # Partials kept in the checkpoint to re-send on a re-driven close, when no feedback says which steps
    # are released: more than the releaser ever lags behind the closes in practice (a step is released
    # as soon as its partials are in).
    KEEP_PARTIALS = 8

    def __init__(
        self,
        deployment: Deployment,
        roster,
        topic_names: dict[str, str],
        store=None,
        isolated: bool = False,
        verifier: CloseVerifier | None = None,
    ):
        """``isolated``: neither send nor wait for forwarded-through markers — only for driving
        partitions in isolation, as unit tests do (nothing is forwarded to them); a worker never is.
        ``verifier``: a close marker counts only when its signature verifies; one that does not is
        dead-lettered with its reason (None: unsigned markers, for tests driving the core without
        keys;
        the worker job always passes one)."""
        self.isolated = isolated
        self.verifier = verifier
        self.deployment = deployment
        self.roster = roster
        self.names = topic_names
        self.store = store
        self.partitions_total = deployment.topics.partitions
        self.parser = ReportParser(roster, deployment.attributes, deployment.horizon)
        roster.index()  # the vectorised user-id index, built now rather than inside the first fetch
        self.states: dict[int, PartitionState] = {}
        # Records not yet handled, per partition, in log order. A close marker whose step needs
        # feedback not yet received stays at the head; the other partitions go on meanwhile (one
        # worker may own every partition, so waiting here would deadlock the releaser).
        self.backlog: dict[int, list[Record]] = {}
        self._rewinds: dict = {}  # partition (or ("repartition", p)) -> (offset sought back to, since when)
        # Reports of users owned elsewhere go to their owner through `repartition` (pipeline.stream.ingest.repartition).
        self.forwarder = Forwarder(
            roster, deployment.attributes, self.partitions_total, deployment.horizon
        )
        self.inboxes: dict[int, Inbox] = {}
        self.emitted: dict[
            int, int
        ] = {}  # partition -> last step whose forwarded-through markers it sent
        self._strays: dict[int, list[Record]] = {}  # repartition records naming no source partition
        self.kept: dict[
            int, dict[int, list]
        ] = {}  # partition -> step -> its partial messages (kept in Redis)
        self._kept_changes: dict[
            int, tuple[set, set]
        ] = {}  # partition -> (steps to write, steps to delete)
        self.released: dict[
            int, int
        ] = {}  # partition -> last step a feedback message proved released
        self.lost: dict[
            int, dict[str, int]
        ] = {}  # partition -> open step -> reports counted on a log since lost
        self._owned: OwnedRows | None = None
        self._feedback_complete: set[int] = set()  # see feedback_checkpoints
        # partition -> {"reports": topic id, "repartition": topic id}: the logs its positions are in,
        # as the last checkpoint recorded them (``restored_logs``) and as assigned now (``log_ids``,
        # written with the next checkpoint); pipeline.stream.kafka.log_identity
        self.restored_logs: dict[int, dict[str, str]] = {}
        self.log_ids: dict[int, dict[str, str]] = {}
        # partition -> upload id -> its messages held until the upload's end record
        # (pipeline.stream.ingest.uploads); in the checkpoint
        self.held: dict[int, HeldUploads] = {}

    # -- assignment ------------------------------------------------------------------------------
    def assign(self, partition: int) -> int:
        """Create (or restore) the state of a newly assigned partition.

        Returns the offset to resume consuming from: the checkpoint's offset + 1, or 0 without a
        checkpoint — never the consumer group's committed offset, which may be past reports that
        were consumed but not yet covered by a checkpoint (they would be lost).
        """
        rows = self.roster.rows_of(partition, self.partitions_total)
        if self._owned is None:  # one roster-wide map for all the partitions this worker holds
            self._owned = OwnedRows.of_roster(self.roster.owners(self.partitions_total))
        state = PartitionState(self.deployment, partition, rows, self.roster.n, self._owned)
        resume = 0
        blob = self.store.load_checkpoint(partition) if self.store is not None else None
        restored = (
            loads_state(blob, self.store.keys.checkpoint(partition)) if blob is not None else {}
        )
        if restored:
            state.set_state(restored)
            resume = state.offset + 1
        self.restored_logs[partition] = dict(restored.get("logs") or {})
        inbox = Inbox(self.partitions_total, state.closed)
        if (
            "repartition" in restored
        ):  # a checkpoint from before repartitioning has none: start at offset 0
            inbox.set_state(restored["repartition"])
        self.states[partition] = state
        self.inboxes[partition] = inbox
        self.held[partition] = HeldUploads(restored.get("uploads"))
        old = restored.get("partials")  # a checkpoint of the previous version kept them inside
        last = range(state.closed - self.KEEP_PARTIALS + 1, state.closed + 1)
        stored = (
            old
            if old is not None
            else (self.store.load_kept_partials(partition, last) if restored else {})
        )
        self.kept[partition] = {int(t): kept_messages(v) for t, v in stored.items()}
        self._kept_changes[partition] = (set(self.kept[partition]) if old else set(), set())
        self.emitted[partition] = state.closed
        self.backlog[partition] = []
        return resume

    def revoke(self, partition: int) -> None:
        self.states.pop(partition, None)
        self.restored_logs.pop(partition, None)
        self.log_ids.pop(partition, None)
        self.backlog.pop(partition, None)
        self.held.pop(partition, None)
        self._rewinds.pop(partition, None)
        self._rewinds.pop(("repartition", partition), None)
        self.inboxes.pop(partition, None)
        self.emitted.pop(partition, None)
        self._strays.pop(partition, None)
        self.kept.pop(partition, None)
        self._kept_changes.pop(partition, None)
        self.released.pop(partition, None)
        self.lost.pop(partition, None)

    def enqueue(
        self, partition: int, records: list[Record], now: float | None = None
    ) -> int | None:
        """Queue records of an assigned partition, skipping any the state or the backlog already holds.

        Returns None, or the offset to seek back to when the records start past the next one this
        partition needs (nothing is queued then): the consumer was positioned past records the state
        does not reflect — a client that moves a new assignment to the group's committed offset, or an
        offset reset — and skipping them would lose reports. Records fetched
        before the seek took effect come the same way and are dropped (seeking again is harmless);
        a gap still there ``REWIND_GRACE_SECONDS`` after the first seek back is a real one
        (transaction markers, retention) and is accepted.
        """
        backlog = self.backlog[partition]
        done = backlog[-1].offset if backlog else self.states[partition].offset
        new = (
            records
            if records and records[0].offset > done
            else [r for r in records if r.offset > done]
        )
        rewind = self._gap(partition, done, new, now)
        if rewind is None:
            backlog.extend(new)
        return rewind

    def enqueue_forwarded(
        self, partition: int, records: list[Record], now: float | None = None
    ) -> int | None:
        """Queue records of the partition's ``repartition`` partition (as :meth:`enqueue`)."""
        inbox = self.inboxes[partition]
        new = [r for r in records if r.offset > inbox.consumed]
        rewind = self._gap(("repartition", partition), inbox.consumed, new, now)
        if rewind is None:
            self._strays.setdefault(partition, []).extend(inbox.enqueue(new))
        return rewind

    def _gap(self, key, done: int, new: list[Record], now: float | None) -> int | None:
        """The offset to seek back to when ``new`` starts past ``done`` + 1 (see :meth:`enqueue`)."""
        now = time.monotonic() if now is None else now
        if new and new[0].offset > done + 1:
            target, since = self._rewinds.get(key, (None, now))
            if target != done + 1:
                since = now
                self._rewinds[key] = (done + 1, now)
            if now - since < self.REWIND_GRACE_SECONDS:
                return done + 1
        self._rewinds.pop(key, None)
        return None

    def drain_all(self, partition: int) -> list:
        """Forwarded reports of the open interval, then the partition's own log, again after every
        close (it opens the next interval), until nothing more can be handled."""
        outputs: list = []
        while True:
            outputs.extend(self.drain_forwarded(partition))
            own = self.drain(partition)
            outputs.extend(own)
            if not any(isinstance(o, CloseOutput) and o.checkpoint for o in own):
                return outputs

    def drain(self, partition: int) -> list[ApplyResult | CloseOutput | ForwardMarkers]:
        """Handle the partition's backlog in order until it is empty or a close waits for feedback.

        Returns the outputs to publish, in order: dead letters of report runs, closed steps.
        """
        backlog = self.backlog.get(partition)
        if not backlog:
            return []
        if not any(
            map(_HEADERS, backlog)
        ):  # no marker (reports carry no headers): one run, no per-record loop
            one_run: list[ApplyResult | CloseOutput | ForwardMarkers] = [
                self.apply_reports(partition, list(backlog))
            ]
            del backlog[:]
            return one_run
        outputs: list[ApplyResult | CloseOutput | ForwardMarkers] = []
        run: list[Record] = []
        replacing = False  # the run holds corrections (pipeline.stream.ingest.corrections)
        done = 0
        for rec in backlog:
            if rec.headers and is_marker(rec.headers):  # reports carry no headers
                if run:
                    outputs.append(self.apply_reports(partition, run, replacing))
                    run = []
                try:
                    step, closed_at = self._marker_fields(rec.value)
                except Unverified as err:  # never closes anything: dead-lettered with why
                    log.error(
                        "partition %d: dead-lettering a close marker at offset %d (%s): %s",
                        partition,
                        rec.offset,
                        err.reason,
                        err,
                    )
                    outputs.append(self._reject_record(partition, rec, err.reason, str(err)))
                    done += 1
                    continue
                next_step = self.states[partition].closed + 1
                if step is None or step > next_step:
                    # Not a close of the next step (the releaser writes markers in order): a garbled
                    # or forged marker. Dead-letter it; raising would crash the worker on every replay.
                    detail = (
                        f"close marker for step {step} but the next step to close is {next_step}: the "
                        f"markers of step(s) {next_step}..{step - 1} never reached this partition (a broker "
                        "that lost its log?); restarting the releaser writes the markers of every closed, "
                        "unreleased step again (docs/streaming.md, 'A lost close')"
                        if step is not None
                        else "close marker without a valid step"
                    )
                    log.error(
                        "partition %d: dead-lettering a close marker at offset %d: %s",
                        partition,
                        rec.offset,
                        detail,
                    )
                    outputs.append(self._reject_record(partition, rec, "malformed", detail))
                    done += 1
                    continue
                if (
                    step < next_step
                ):  # a repeated marker: re-send what the checkpoint keeps, wait for nothing
                    outputs.extend(self._resend(partition, step, rec.offset))
                    done += 1
                    continue
                if step > self.emitted[partition] and not self.isolated:
                    # everything before the marker has been forwarded: tell every owner, once the
                    # broker has acknowledged it (the worker waits for that before sending these)
                    outputs.append(self.forwarder.markers(partition, step))
                    self.emitted[partition] = step
                if self.feedback_outstanding(partition) or not (
                    self.isolated or self.inboxes[partition].ready(step)
                ):
                    break  # resume when the feedback of the last closed step / the forwarded reports arrive
                outputs.extend(self._expire_uploads(partition))
                messages, blob, summary = self.close(partition, step, rec.offset, closed_at)
                write, drop = self._kept_changes.get(partition, (set(), set()))
                kept = self.kept.get(partition, {})
                outputs.append(
                    CloseOutput(
                        partition,
                        step,
                        messages,
                        blob,
                        summary,
                        {t: kept_blob(kept[t]) for t in sorted(write) if t in kept},
                        sorted(drop),
                    )
                )
                self._kept_changes[partition] = (set(), set())
            elif rec.headers and (upload := upload_of(rec.headers)) is not None:
                if run:
                    outputs.append(self.apply_reports(partition, run, replacing))
                    run = []
                outputs.extend(self._upload_record(partition, upload, rec))
            else:
                correction = is_replacement(rec.headers) if rec.headers else False
                if run and correction != replacing:
                    outputs.append(self.apply_reports(partition, run, replacing))
                    run = []
                replacing = correction
                run.append(rec)
            done += 1
        if run:
            outputs.append(self.apply_reports(partition, run, replacing))
        del backlog[:done]
        return outputs

    # -- reports ---------------------------------------------------------------------------------
    def apply_reports(
        self,
        partition: int,
        records: list[Record],
        replacing: bool = False,
        committed: tuple[int, int] | None = None,
    ) -> ApplyResult:
        """Parse and apply a run of report records (no markers) of one partition; ``replacing``:
        a run of corrections (:meth:`PartitionState.replace`). ``committed``: (commit offset, rank
        of the run's first report) of a held upload's messages, whose reports take their log
        positions from the commit (``result.ranked``: how many ranks they took); dead letters still
        name each report's own message.

        A batch message whose every report one check rejects (all ``late``: a step closed before
        it; all ``duplicate``: a batch sent again) is one dead letter of the whole message (its
        bytes, no ``dpstream-batch-index``, ``dpstream-reports`` its report count, key
        ``<partition>:<offset>:-``, the same on a replay); a message with any report accepted,
        forwarded or rejected otherwise has one dead letter per rejected report, as before.
        The counts (``result.reasons``, the intake) are of reports either way."""
        state = self.states[partition]
        result = ApplyResult(partition=partition)
        if not records:
            return result
        last = records[-1].offset
        values = list(map(_VALUE, records))
        try:
            largest = max(map(len, values))  # C-level: no per-record Python on the hot path
        except TypeError:  # a record without a value
            largest = max(len(v or b"") for v in values)
        if (
            largest > MAX_REPORT_BYTES
        ):  # never parsed: dead-lettered as a bounded copy, the others are used
            big = [r for r in records if len(r.value or b"") > MAX_REPORT_BYTES]
            records = [r for r in records if len(r.value or b"") <= MAX_REPORT_BYTES]
            values = list(map(_VALUE, records))
            for r in big:
                result.dead_letters.append(
                    self._letter(
                        "too_large",
                        f"message of {len(r.value):,} bytes, above the {MAX_REPORT_BYTES:,} bytes a report "
                        "(or a batch of reports) may have",
                        r.value,
                        partition,
                        r.offset,
                        None,
                    )
                )
            result.reasons["too_large"] = len(big)
            if not records:
                state.offset = last
                return self._counted(result, 0, [], [])
        parsed = self.parser.parse(values)
        # a batch message whose reports one check rejects all: one dead letter (ParsedReports.reject)
        parsed.whole = True
        at = None
        if committed is not None:  # (commit offset, rank in the upload) per report
            at = np.empty((2, len(parsed)), dtype=np.int64)
            at[0] = committed[0]
            at[1] = np.arange(committed[1], committed[1] + len(parsed))
            result.ranked = len(parsed)
        # reports of users another partition owns (a producer not partitioning by murmur2 of the user
        # id): forwarded to their owner, which applies them (pipeline.stream.ingest.repartition)
        foreign = state.local.foreign(parsed.rows)
        if foreign.any():
            offsets = np.fromiter(map(_OFFSET, records), dtype=np.int64, count=len(records))
            result.forwards = self.forwarder.forward(
                partition, offsets, parsed.take(foreign), None if at is None else at[:, foreign]
            )
            if replacing:
                result.forwards = [
                    (p, v, [*h, (REPLACE_HEADER, b"1")]) for p, v, h in result.forwards
                ]
            result.forwarded = int(foreign.sum())
            parsed = parsed.take(~foreign)
            at = None if at is None else at[:, ~foreign]
        displaced: list = []
        if replacing:
            offsets = np.fromiter(map(_OFFSET, records), dtype=np.int64, count=len(records))
            positions = (
                source_positions(offsets[parsed.message], parsed.batch_index)
                if at is None
                else source_positions(at[0], at[1])
            )
            applied = state.replace(parsed, 0, positions, displaced)
        else:
            applied = state.apply(parsed, 0, displaced)
        state.offset = last
        for rej in parsed.rejections:
            result.dead_letters.append(
                self._letter(
                    rej.reason,
                    rej.detail,
                    rej.original,
                    partition,
                    records[rej.message].offset,
                    rej.batch_index,
                    rej.reports,
                )
            )
        return self._counted(result, len(applied), parsed.rejections, displaced)

    # -- uploads held until committed (pipeline.stream.ingest.uploads) ----------------------------------
    def _upload_record(self, partition: int, upload: str, rec: Record) -> list[ApplyResult]:
        """A message of an upload (held), or its end record on this partition: a commit applies the
        held messages here, at the commit's position; an abort drops them."""
        state = self.states[partition]
        held = self.held[partition]
        end = end_of(rec.headers)
        state.offset = max(state.offset, rec.offset)  # handled: held, dropped or applied here
        if end is None:
            detail = (
                "upload {} was not committed while this partition held more than "
                f"{limits.MAX_HELD_BYTES:,} bytes of uncommitted uploads: none of its reports is used"
            )
            return [
                self._uncommitted(partition, given_up, detail.format(oldest))
                for oldest, given_up in held.hold(upload, rec.offset, rec.value, rec.headers)
            ]
        this = held.pop(upload)
        if this is None:  # nothing of it here (sent nothing to this partition, or ended already)
            return []
        if end == "abort":
            log.info(
                "partition %d: upload %s aborted by its sender at offset %d: its %d held message(s) "
                "dropped",
                partition,
                upload,
                rec.offset,
                len(this.offsets),
            )
            return []
        stated = end_count(rec.value)
        if not this.complete(stated):
            detail = (
                f"the commit of upload {upload} at offset {rec.offset} names {stated} message(s) on "
                f"this partition, {len(this.offsets)} were held"
                + (f" (numbered {sorted(this.numbers)[:5]}...)" if this.numbers else "")
                + ": none of them is used"
            )
            return [self._uncommitted(partition, this, detail)]
        if this.over_rank_limit(self.parser):
            detail = (
                f"the commit of upload {upload} at offset {rec.offset}: more than "
                f"{uploads.MAX_UPLOAD_REPORTS:,} of its reports on this partition (a committed "
                "report's place in its upload is 24 bits): none of them is used"
            )
            return [self._uncommitted(partition, this, detail)]
        records = [
            Record(this.offsets[i], this.values[i], this.headers[i]) for i in this.in_order()
        ]
        results: list[ApplyResult] = []
        rank = 0
        for correction, group in groupby(records, key=lambda r: is_replacement(r.headers)):
            results.append(
                self.apply_reports(partition, list(group), correction, (rec.offset, rank))
            )
            rank += results[-1].ranked
        state.offset = max(state.offset, rec.offset)  # apply_reports set it to the last message's
        return results

    def _expire_uploads(self, partition: int) -> list[ApplyResult]:
        """At a close: an upload held since before the previous close, still without its end record
        (its sender stopped), is dead-lettered ``uncommitted``."""
        detail = (
            "upload {} never sent its commit record: held through two closes, none of its reports "
            "is used (was its produce stopped?)"
        )
        return [
            self._uncommitted(partition, expired, detail.format(upload))
            for upload, expired in self.held[partition].close()
        ]

    def _uncommitted(self, partition: int, upload: HeldUpload, detail: str) -> ApplyResult:
        """Every held message of an upload as a dead letter (reason ``uncommitted``), with the
        number of reports it holds (a batch message: all of them; counted by the parser)."""
        state = self.states[partition]
        letters, reports = [], 0
        for offset, value in zip(upload.offsets, upload.values, strict=True):
            parsed = self.parser.parse([value]) if len(value) <= MAX_REPORT_BYTES else None
            n = 1 if parsed is None else max(1, len(parsed) + len(parsed.rejections))
            letters.append(self._letter("uncommitted", detail, value, partition, offset, None, n))
            reports += n
        state.intake.count(0, {"uncommitted": reports})
        return ApplyResult(
            partition=partition, reasons={"uncommitted": reports}, dead_letters=letters
        )

    def drain_forwarded(self, partition: int) -> list[ApplyResult]:
        """Apply the forwarded reports of the partition's open interval (see :class:`Inbox`)."""
        outputs = [
            self._reject_record(
                partition,
                rec,
                "malformed",
                "repartition record without a source partition",
                topic="repartition",
            )
            for rec in self._strays.pop(partition, [])
        ]
        for source, records in self.inboxes[partition].take(self.states[partition].closed):
            # runs of one format (JSON: forwarded before the rows format) and of corrections or not
            runs = groupby(records, key=lambda r: (is_rows(r.headers), is_replacement(r.headers)))
            for (_, replacing), run in runs:
                outputs.extend(self.apply_forwarded(partition, source, list(run), replacing))
        return outputs

    def apply_forwarded(
        self, partition: int, source: int, records: list[Record], replacing: bool = False
    ) -> list[ApplyResult]:
        """Apply a run of batches (all in one format) forwarded from reports partition ``source``. Rows
        at or below the largest source position already applied from ``source`` are copies (a replay
        of the source): skipped. Rejections are dead-lettered under their source position, as on the
        source; a batch in the rows format that fails its checks is dead-lettered whole."""
        state, inbox = self.states[partition], self.inboxes[partition]
        refused = []
        if is_rows(records[0].headers):
            parsed, bad = self.forwarder.decode(records, partition)
            refused = [
                self._reject_record(
                    partition,
                    records[i],
                    "malformed",
                    "forwarded batch with a row not of this partition's users, or out of domain",
                    topic="repartition",
                )
                for i in bad
            ]
        else:
            parsed = self.parser.parse([r.value for r in records])
        table = [positions_of(r.headers) for r in records]
        sizes = np.array([0 if t is None else t.shape[1] for t in table], dtype=np.int64)
        base = np.concatenate([[0], np.cumsum(sizes)])
        flat = np.concatenate(
            [t for t in table if t is not None] or [np.zeros((2, 0), np.int64)], axis=1
        )

        def position(message: int, item: int | None) -> tuple[int, int | None]:
            if item is None or not 0 <= item < sizes[message]:
                return -1, item
            off, row = flat[:, base[message] + item]
            return int(off), (None if row < 0 else int(row))

        inside = (parsed.batch_index >= 0) & (parsed.batch_index < sizes[parsed.message])
        at = base[parsed.message][inside] + parsed.batch_index[inside]
        ordered = np.full(len(parsed), -1, dtype=np.int64)
        ordered[inside] = source_positions(flat[0, at], flat[1, at])
        before = np.maximum.accumulate(np.r_[inbox.applied[source], ordered])[:-1]
        fresh = ~inside | (
            ordered > before
        )  # a row without a known position is never taken for a copy
        inbox.applied[source] = max(int(inbox.applied[source]), int(ordered.max(initial=-1)))
        parsed = parsed.take(fresh)
        displaced: list = []
        if replacing:
            applied = state.replace(parsed, 1 + source, ordered[fresh], displaced)
        else:
            applied = state.apply(parsed, 1 + source, displaced)
        result = ApplyResult(partition=partition)
        for rej in parsed.rejections:
            off, row = position(rej.message, rej.batch_index)
            result.dead_letters.append(
                self._letter(rej.reason, rej.detail, rej.original, source, off, row)
            )
        return [*refused, self._counted(result, len(applied), parsed.rejections, displaced)]

    def _counted(
        self, result: ApplyResult, applied: int, rejections: list, displaced: list
    ) -> ApplyResult:
        """Count a run's outcome (reports displaced by one of higher precedence become duplicates)."""
        state = self.states[result.partition]
        for local, step, codes, rank in displaced:
            report = self.forwarder.report(state.rows[local], step, codes)
            detail = (
                "displaced by a report for the same user and step that arrived while the same step was open, "
                "directly or from a lower reports partition (which takes precedence)"
            )
            headers = dead_letter_headers(
                "duplicate", detail, self.names["reports"], result.partition, -1, None
            )
            result.dead_letters.append(
                (
                    f"{result.partition}:displaced:{report['user']}:{step}:{rank}".encode(),
                    orjson.dumps(report),
                    headers,
                )
            )
        result.accepted = applied - len(displaced)
        for rej in rejections:  # reports, not letters: a whole message's counts all it holds
            result.reasons[rej.reason] = result.reasons.get(rej.reason, 0) + rej.reports
        if displaced:
            result.reasons["duplicate"] = result.reasons.get("duplicate", 0) + len(displaced)
        state.intake.count(result.accepted, result.reasons, result.forwarded)
        return result

    def _letter(
        self,
        reason: str,
        detail: str,
        original: bytes,
        source: int,
        offset: int,
        item: int | None,
        reports: int = 1,
    ) -> tuple[bytes, bytes, list]:
        """A dead letter keyed by the report's position in reports partition ``source``: stable under
        replay, whatever the run split or the path it took. ``reports``: a whole message's."""
        key = f"{source}:{offset}:{'-' if item is None else item}".encode()
        headers = dead_letter_headers(
            reason, detail, self.names["reports"], source, offset, item, reports
        )
        return key, *bounded_copy(original, headers)

    def _marker_fields(self, value: bytes) -> tuple[int | None, int | None]:
        """(step, closed_at) of a close marker: verified (:class:`Unverified` when it does not
        verify), or
        as written when the core has no verifier."""
        if self.verifier is None:
            return parse_close_marker(value)
        signed = self.verifier.marker(value)
        return signed.step, signed.closed_at

    # -- close -----------------------------------------------------------------------------------
    def close(
        self, partition: int, step: int, marker_offset: int, closed_at: int | None = None
    ) -> tuple[list[tuple[bytes, bytes]], bytes, dict]:
        """Close ``step`` in ``partition``. Returns (partial messages, checkpoint blob, summary).

        ``closed_at`` (the marker's public close time, ms) travels in the partial to the releaser,
        which stamps the step's public records with it.

        A marker for a step that is already closed (a replay, or a duplicate marker) yields no
        messages. The caller publishes the partial messages, then stores the checkpoint.
        """
        state = self.states[partition]
        if step <= state.closed:
            state.offset = max(state.offset, marker_offset)
            return (
                self.kept.get(partition, {}).get(step, []),
                b"",
                {"step": step, "duplicate": True},
            )
        partial = state.close(step, marker_offset)
        partial["closed_at"] = closed_at
        state.offset = marker_offset
        messages = encode_partial(partial)
        kept = self.kept.setdefault(partition, {})
        kept[step] = messages
        self._kept_changes.setdefault(partition, (set(), set()))[0].add(step)
        self._drop_kept(partition, sorted(kept)[: -self.KEEP_PARTIALS])
        blob = self.checkpoint(partition)
        summary = {"step": step, "users": partial["users"], "reported": partial["reported"]}
        return messages, blob, summary

    def _resend(self, partition: int, step: int, offset: int) -> list:
        """A marker of a step this partition closed already: its forwarded-through markers (a partition
        that lost its ``repartition`` log waits for them) and the kept partial, to publish again."""
        messages, _, summary = self.close(partition, step, offset)
        if step <= self.released.get(partition, 0):
            log.info(
                "partition %d: close marker for step %d, released already: its partial is not needed",
                partition,
                step,
            )
        elif not messages:
            log.warning(
                "partition %d: close marker for step %d, closed here already, but its partial is no longer "
                "kept (only the last %d closed steps are): if the releaser still waits for it, the step can "
                "not be released (docs/streaming.md, 'A lost close')",
                partition,
                step,
                self.KEEP_PARTIALS,
            )
        else:
            log.info(
                "partition %d: close marker for step %d, closed here already: re-sending its partial",
                partition,
                step,
            )
        out = [] if self.isolated else [self.forwarder.markers(partition, step)]
        return out + [CloseOutput(partition, step, messages, b"", summary)]

    def feedback_outstanding(self, partition: int) -> bool:
        return bool(self.states[partition].feedback_needed)

    def apply_feedback(self, partition: int, value: bytes) -> bool:
        """Apply one feedback message; returns True when it was new for this partition."""
        state = self.states.get(partition)
        if state is None:
            return False
        msg = orjson.loads(value)
        if (
            int(msg["step"]) <= state.closed
        ):  # released implies closed here: anything else proves nothing
            self._released(partition, int(msg["step"]))
        before = set(state.feedback_needed)
        state.apply_feedback(int(msg["step"]), str(msg["release"]), msg)
        changed = before != state.feedback_needed
        if changed and not state.feedback_needed:
            # checkpoint after the last feedback of the step, so a restart does not wait for it again
            self._feedback_complete.add(partition)
        return changed

    def _released(self, partition: int, step: int) -> None:
        """Step ``step`` is committed in Redis (a feedback message of it exists: the releaser publishes
        feedback only after the commit, ``pipeline.stream.releaser.coordinator``), so no re-driven close
        asks for its partial, nor for an earlier one's: drop them (from Redis with the next checkpoint)."""
        if step <= self.released.get(partition, 0):
            return
        self.released[partition] = step
        self._drop_kept(partition, [t for t in self.kept.get(partition, {}) if t <= step])

    def _drop_kept(self, partition: int, steps: list[int]) -> None:
        """Forget the kept partials of ``steps``: not written to Redis if still pending, else deleted
        from it with the partition's next checkpoint."""
        kept = self.kept.get(partition, {})
        write, drop = self._kept_changes.setdefault(partition, (set(), set()))
        for t in steps:
            del kept[t]
            write.discard(t)
            drop.add(t)

    def note_lost_log(
        self, partition: int, previous: dict | None, log_end: int | None
    ) -> dict[str, int]:
        """Compare the partition's last intake snapshot (``previous``, from Redis) with the log it resumes on.

        A snapshot that counted more records than the log now holds (``log_end``) describes a log the
        broker lost: the reports it counted for steps still open are gone (the state restored from the
        checkpoint does not hold them). Those counts are remembered — carried over from ``previous`` on
        a later restart — until the state holds as many again (sent again) or the step closes, so
        ``dpstream status`` and ``close`` can say so rather than show counts of reports that no longer
        exist. Returns open step -> users reported before the loss, for the steps short of it."""
        before: dict[str, int] = {}
        if previous:
            before = {t: int(n) for t, n in previous.get("lost", {}).items()}
            if log_end is not None and int(previous.get("offset", -1)) + 1 > log_end:
                for t, n in previous.get("open", {}).items():
                    before[t] = max(before.get(t, 0), int(n))
        self.lost[partition] = before
        return self._short(partition)

    def _short(self, partition: int) -> dict[str, int]:
        """Open steps whose state holds fewer users than were counted before a lost log: that count."""
        state = self.states[partition]
        now = state.intake_summary()["open"]
        return {
            t: n
            for t, n in self.lost.get(partition, {}).items()
            if int(t) > state.closed and n > int(now.get(t, 0))
        }

    def intake_snapshot(self, partition: int) -> dict:
        """The partition's intake counts for Redis (``dpstream status`` / ``close``): what its state holds,
        the ``repartition`` position, and per open step short of it the count before a lost log."""
        short = self._short(partition)
        held = self.held.get(partition)
        return {
            **self.states[partition].intake_summary(),
            "forwarded_offset": self.inboxes[partition].consumed,
            **({"lost": short} if short else {}),
            **({"held": held.summary()} if held else {}),
        }

    def feedback_checkpoints(self) -> dict[int, bytes]:
        """The checkpoints due since the last call: partitions whose step got its last feedback (the
        caller stores them, with :meth:`take_dropped`; the store only reads)."""
        due, self._feedback_complete = self._feedback_complete, set()
        return {p: self.checkpoint(p) for p in sorted(due) if p in self.states}

    def take_dropped(self, partition: int) -> list[int]:
        """The kept partials to delete from Redis that no close has deleted yet (a feedback proved
        their steps released); the caller deletes them with the partition's next checkpoint."""
        drop = self._kept_changes.get(partition, (set(), set()))[1]
        out = sorted(drop)
        drop.clear()
        return out

    def checkpoint(self, partition: int) -> bytes:
        """The partition's state with its ``repartition`` position (what was forwarded to it and applied);
        the kept partials are stored beside it (:class:`CloseOutput`), not in it: rewriting them with every
        checkpoint made its size, and every close's Redis write, grow with the steps."""
        return dumps_state(
            {
                **self.states[partition].get_state(),
                "repartition": self.inboxes[partition].get_state(),
                "logs": self.log_ids.get(partition, {}),
                **self._held_state(partition),
            }
        )

    def _held_state(self, partition: int) -> dict:
        held = self.held.get(partition)
        return {"uploads": held.get_state()} if held else {}

    def _reject_record(
        self, partition: int, rec: Record, reason: str, detail: str, topic: str = "reports"
    ) -> ApplyResult:
        """One record straight to the dead-letter topic (its offset counts as consumed)."""
        state = self.states[partition]
        if topic == "reports":
            state.offset = max(state.offset, rec.offset)
        headers = dead_letter_headers(
            reason, detail, self.names[topic], partition, rec.offset, None
        )
        state.intake.count(0, {reason: 1})
        key = (
            f"{partition}:{rec.offset}:-"
            if topic == "reports"
            else f"{topic}:{partition}:{rec.offset}:-"
        )
        return ApplyResult(
            partition=partition,
            reasons={reason: 1},
            dead_letters=[(key.encode(), *bounded_copy(bytes(rec.value or b""), headers))],
        )


def kept_blob(messages: list[tuple[bytes, bytes]]) -> bytes:
    """A closed step's partial messages as Redis keeps them (:func:`kept_messages` reverses it)."""
    return dumps_state(
        {"messages": [[k.decode(), np.frombuffer(v, dtype=np.uint8)] for k, v in messages]}
    )


def kept_messages(stored) -> list[tuple[bytes, bytes]]:
    """The partial messages of a :func:`kept_blob` (or of a checkpoint of the previous version's list)."""
    msgs = loads_state(stored)["messages"] if isinstance(stored, bytes) else stored
    return [(k.encode(), np.asarray(v, dtype=np.uint8).tobytes()) for k, v in msgs]


def bounded_copy(original: bytes, headers: list) -> tuple[bytes, list]:
    """A dead letter's value and headers: the original bytes, cut to ``DEAD_LETTER_COPY_BYTES`` (header
    ``dpstream-original-size`` then gives the full size), so a dead letter always fits the producer's limit."""
    original = bytes(original or b"")
    if len(original) <= DEAD_LETTER_COPY_BYTES:
        return original, headers
    return original[:DEAD_LETTER_COPY_BYTES], [
        *headers,
        ("dpstream-original-size", str(len(original)).encode()),
    ]
