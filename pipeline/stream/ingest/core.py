"""Ingest logic of a worker, independent of the transport (jobs/worker.py drives it).

A worker owns some partitions of ``reports``. For each it keeps a :class:`PartitionState`
(restored from the partition's Redis checkpoint when assigned). Records of a partition are handled
in log order: runs of reports are parsed and applied in bulk (vectorised), and a close marker for
step t closes the step: imputation, partial aggregates, a checkpoint holding the state and the
marker's offset. After a crash the partition is replayed from the checkpoint's offset; since the
state is restored to exactly that point and the cut is a log position, the replay reproduces the
same partials (the releaser deduplicates them) and every accepted report counts exactly once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import orjson

from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.kafka.codecs import CONTROL_HEADER, dead_letter_headers, encode_partial, parse_close_marker
from pipeline.stream.ingest.partition_state import PartitionState
from pipeline.stream.ingest.reports import ReportParser

__all__ = ["IngestCore", "Record", "ApplyResult", "CloseOutput", "is_marker"]


@dataclass(frozen=True)
class Record:
    offset: int
    value: bytes
    headers: tuple = ()


def is_marker(headers) -> bool:
    for key, value in headers or ():
        if key == CONTROL_HEADER and value == b"close":
            return True
    return False


@dataclass
class CloseOutput:
    """A closed step: publish ``messages`` (and wait for the broker's ack), then store ``checkpoint``."""

    partition: int
    step: int
    messages: list[tuple[bytes, bytes]]
    checkpoint: bytes
    summary: dict


@dataclass
class ApplyResult:
    partition: int = -1
    accepted: int = 0
    dead_letters: list[tuple[bytes, bytes, list]] = field(default_factory=list)  # (key, value, headers)
    reasons: dict[str, int] = field(default_factory=dict)


class IngestCore:
    REWIND_GRACE_SECONDS = 10.0  # see enqueue

    def __init__(self, deployment, roster, topic_names: dict[str, str], store=None):
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
        self._rewinds: dict[int, tuple[int, float]] = {}  # partition -> (offset sought back to, since when)

    # -- assignment ------------------------------------------------------------------------------
    def assign(self, partition: int) -> int:
        """Create (or restore) the state of a newly assigned partition.

        Returns the offset to resume consuming from: the checkpoint's offset + 1, or 0 without a
        checkpoint — never the consumer group's committed offset, which may be past reports that
        were consumed but not yet covered by a checkpoint (they would be lost).
        """
        rows = self.roster.rows_of(partition, self.partitions_total)
        state = PartitionState(self.deployment, partition, rows, self.roster.n)
        resume = 0
        blob = self.store.load_checkpoint(partition) if self.store is not None else None
        if blob is not None:
            state.set_state(loads_state(blob))
            resume = state.offset + 1
        self.states[partition] = state
        self.backlog[partition] = []
        return resume

    def revoke(self, partition: int) -> None:
        self.states.pop(partition, None)
        self.backlog.pop(partition, None)
        self._rewinds.pop(partition, None)

    def enqueue(self, partition: int, records: list[Record], now: float | None = None) -> int | None:
        """Queue records of an assigned partition, skipping any the state or the backlog already holds.

        Returns None, or the offset to seek back to when the records start past the next one this
        partition needs (nothing is queued then): the consumer was positioned past records the state
        does not reflect — a client that moves a new assignment to the group's committed offset, or an
        offset reset — and skipping them would lose reports. Records fetched
        before the seek took effect come the same way and are dropped (seeking again is harmless);
        a gap still there ``REWIND_GRACE_SECONDS`` after the first seek back is a real one
        (transaction markers, retention) and is accepted.
        """
        now = time.monotonic() if now is None else now
        backlog = self.backlog[partition]
        done = backlog[-1].offset if backlog else self.states[partition].offset
        new = [r for r in records if r.offset > done]
        if new and new[0].offset > done + 1:
            target, since = self._rewinds.get(partition, (None, now))
            if target != done + 1:
                since = now
                self._rewinds[partition] = (done + 1, now)
            if now - since < self.REWIND_GRACE_SECONDS:
                return done + 1
        self._rewinds.pop(partition, None)
        backlog.extend(new)
        return None

    def drain(self, partition: int) -> list[ApplyResult | CloseOutput]:
        """Handle the partition's backlog in order until it is empty or a close waits for feedback.

        Returns the outputs to publish, in order: dead letters of report runs, closed steps.
        """
        backlog = self.backlog.get(partition)
        if not backlog:
            return []
        outputs: list[ApplyResult | CloseOutput] = []
        run: list[Record] = []
        done = 0
        for rec in backlog:
            if rec.headers and is_marker(rec.headers):  # reports carry no headers
                if run:
                    outputs.append(self.apply_reports(partition, run))
                    run = []
                step, closed_at = parse_close_marker(rec.value)
                next_step = self.states[partition].closed + 1
                if step is None or step > next_step:
                    # Not a close of the next step (the releaser writes markers in order): a garbled
                    # or forged marker. Dead-letter it; raising would crash the worker on every replay.
                    detail = (f"close marker for step {step} but the next step to close is {next_step}"
                              if step is not None else "close marker without a valid step")
                    outputs.append(self._reject_record(partition, rec, "malformed", detail))
                    done += 1
                    continue
                if self.feedback_outstanding(partition):
                    break  # resume when the feedback of the last closed step arrives
                messages, blob, summary = self.close(partition, step, rec.offset, closed_at)
                outputs.append(CloseOutput(partition, step, messages, blob, summary))
            else:
                run.append(rec)
            done += 1
        if run:
            outputs.append(self.apply_reports(partition, run))
        del backlog[:done]
        return outputs

    # -- reports ---------------------------------------------------------------------------------
    def apply_reports(self, partition: int, records: list[Record]) -> ApplyResult:
        """Parse and apply a run of report records (no markers) of one partition."""
        state = self.states[partition]
        result = ApplyResult(partition=partition)
        if not records:
            return result
        parsed = self.parser.parse([r.value for r in records])
        # reports of users another partition owns (a producer not keyed by user id)
        foreign = state.local[parsed.rows] < 0 if len(parsed) else np.zeros(0, dtype=bool)
        if foreign.any():
            parsed.reject(foreign, "wrong_partition",
                          f"user is owned by another partition; key reports by user id (partition {partition})")
            parsed = parsed.take(~foreign) if (~foreign).any() else parsed.take(np.zeros(len(parsed), dtype=bool))
        applied = state.apply(parsed)
        result.accepted = len(applied)
        state.offset = records[-1].offset
        for rej in parsed.rejections:
            result.reasons[rej.reason] = result.reasons.get(rej.reason, 0) + 1
            offset = records[rej.message].offset
            item = "-" if rej.batch_index is None else str(rej.batch_index)
            key = f"{partition}:{offset}:{item}".encode()  # stable under replay, whatever the run split
            headers = dead_letter_headers(rej.reason, rej.detail, self.names["reports"], partition, offset,
                                          rej.batch_index)
            result.dead_letters.append((key, rej.original, headers))
        state.intake.count(result.accepted, result.reasons)
        return result

    # -- close -----------------------------------------------------------------------------------
    def close(self, partition: int, step: int, marker_offset: int,
              closed_at: int | None = None) -> tuple[list[tuple[bytes, bytes]], bytes, dict]:
        """Close ``step`` in ``partition``. Returns (partial messages, checkpoint blob, summary).

        ``closed_at`` (the marker's public close time, ms) travels in the partial to the releaser,
        which stamps the step's public records with it.

        A marker for a step that is already closed (a replay, or a duplicate marker) yields no
        messages. The caller publishes the partial messages, then stores the checkpoint.
        """
        state = self.states[partition]
        if step <= state.closed:
            state.offset = max(state.offset, marker_offset)
            return [], b"", {"step": step, "duplicate": True}
        partial = state.close(step)
        partial["closed_at"] = closed_at
        state.offset = marker_offset
        messages = encode_partial(partial)
        blob = dumps_state(state.get_state())
        summary = {"step": step, "users": partial["users"], "reported": partial["reported"]}
        return messages, blob, summary

    def feedback_outstanding(self, partition: int) -> bool:
        return bool(self.states[partition].feedback_needed)

    def apply_feedback(self, partition: int, value: bytes) -> bool:
        """Apply one feedback message; returns True when it was new for this partition."""
        state = self.states.get(partition)
        if state is None:
            return False
        msg = orjson.loads(value)
        before = set(state.feedback_needed)
        state.apply_feedback(int(msg["step"]), str(msg["release"]), msg)
        changed = before != state.feedback_needed
        if changed and self.store is not None and not state.feedback_needed:
            # checkpoint after the last feedback of the step, so a restart does not wait for it again
            self.store.save_checkpoint(partition, dumps_state(state.get_state()))
        return changed

    def _reject_record(self, partition: int, rec: Record, reason: str, detail: str) -> ApplyResult:
        """One record straight to the dead-letter topic (its offset counts as consumed)."""
        state = self.states[partition]
        state.offset = max(state.offset, rec.offset)
        headers = dead_letter_headers(reason, detail, self.names["reports"], partition, rec.offset, None)
        state.intake.count(0, {reason: 1})
        return ApplyResult(partition=partition, reasons={reason: 1},
                           dead_letters=[(f"{partition}:{rec.offset}:-".encode(), bytes(rec.value), headers)])
