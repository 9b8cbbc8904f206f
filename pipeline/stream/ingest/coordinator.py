"""The ingest protocol of a worker, without Kafka: where to resume, a lost log, and the commit order
of a fetch (docs/streaming.md, "Processes").

:class:`IngestCoordinator` is driven by plain calls — partitions assigned (:meth:`on_assign`) or
revoked (:meth:`on_revoke`), a fetch arrived (:meth:`handle`) — around one transport-free
:class:`pipeline.stream.ingest.core.IngestCore`, and reaches the outside only through

* a :class:`pipeline.stream.state.commit_order.CommitOrder` over a publisher (the broker, in the job),
  which owns the order "publish, await the acknowledgements, then write the checkpoint";
* an :class:`pipeline.stream.state.store_async.AsyncStateStore` (Redis: checkpoints, intake counts);
* ``log_ends(tps)``: where each assigned partition's log truly ends, and ``log_ids(topics)``: the
  broker's topic ids (None: it has none), to notice a broker that lost or replaced its logs: a
  checkpoint records the topic ids of the logs its offsets are in
  (:mod:`pipeline.stream.kafka.log_identity`);
* ``seek(tp, offset)``: move the consumer back when a fetch starts past the next record to handle;

so the job (``jobs/worker.py``) is the Kafka consumer around it and the tests drive it directly.
A partition ``tp`` is anything with ``.topic`` and ``.partition`` (aiokafka's ``TopicPartition``);
a fetch maps each to records with ``.offset``, ``.value`` and ``.headers``.

The order of a fetch: feedback first (a close in the same fetch may wait for it), then the
partitions' backlogs; every partial, forwarded report and dead letter is handed to the producer,
and only once the broker acknowledged all of them are the checkpoints and intake counts written
(forwarded reports are awaited by the next fetch unless a checkpoint or a forwarded-through marker
needs them sooner: :meth:`IngestCoordinator.drain`). A
checkpoint says "step closed, records up to its marker handled": written before the
acknowledgement, a crash in between would lose the partials (the replay starts after the marker);
sent again after a crash before the checkpoint, they are the same bytes under the same keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from pipeline.stream.ingest.core import ApplyResult, CloseOutput, IngestCore
from pipeline.stream.ingest.repartition import ForwardMarkers
from pipeline.stream.process.faults import crash_point
from pipeline.stream.process.metrics import METRICS, forget_partition, observe_partition
from pipeline.stream.state.commit_order import Batch, CommitOrder

if TYPE_CHECKING:
    from pipeline.stream.state.store_async import AsyncStateStore

__all__ = ["IngestCoordinator"]

log = logging.getLogger("dpstream.worker")


class IngestCoordinator:
    """One worker's protocol state around its :class:`IngestCore`."""

    def __init__(
        self,
        core: IngestCore,
        store: AsyncStateStore,
        commit_order: CommitOrder,
        log_ends: Callable[[list], Awaitable[dict[Any, int]]],
        seek: Callable[[Any, int], None] = lambda tp, offset: None,
        log_ids: Callable[[list[str]], Awaitable[dict[str, str | None]]] | None = None,
    ):
        self.core = core
        self.names = core.names
        self.store = store
        self.commit_order = commit_order
        self.log_ends = log_ends
        self.log_ids = log_ids
        self.seek = seek
        # Held while a fetch is handled: a revocation waits for it, so a partition's old owner has
        # written its last checkpoint before the new owner reads it.
        self.busy = asyncio.Lock()
        self.feedback_done: dict[
            int, int
        ] = {}  # feedback partition -> next offset (lag metric only)
        # Forwards of the last fetch, not yet awaited: the next fetch is parsed while the broker
        # acknowledges them (see drain).
        self.forwarding: tuple[Batch, set[int]] | None = None

    # -- assignment ------------------------------------------------------------------------------
    async def on_assign(self, tps) -> dict[Any, int]:
        """Positions from the Redis checkpoints, whatever the group committed; a log that is not the one
        the checkpoint's offsets are in (another topic id), or that ends before the checkpoint, was lost
        (recorded, and read from its start however far the new log has grown)."""
        positions = {}
        reports = [tp for tp in tps if tp.topic == self.names["reports"]]
        forwarded = [tp for tp in tps if tp.topic == self.names["repartition"]]
        ends = await self.log_ends(reports + forwarded)
        ids = (
            await self.log_ids([self.names["reports"], self.names["repartition"]])
            if self.log_ids
            else {}
        )
        current = {
            "reports": ids.get(self.names["reports"]),
            "repartition": ids.get(self.names["repartition"]),
        }
        previous = await self.store.intake_of(
            tp.partition for tp in reports
        )  # the counts before this assignment
        snapshots = {}
        for tp in sorted(
            tps, key=lambda tp: tp.topic == self.names["repartition"]
        ):  # reports partitions first
            if tp.topic == self.names["repartition"]:
                positions[tp] = self._forwarded_position(
                    tp, ends.get(tp), self._replaced(tp.partition, current, "repartition")
                )
                continue
            if tp.topic == self.names["feedback"]:
                # Re-read feedback from the start (one small message per release and step): the last
                # closed step's feedback may have been consumed by a previous owner after its checkpoint.
                # apply_feedback ignores messages of other steps and repeats.
                positions[tp] = 0
                continue
            resume = self.core.assign(tp.partition)
            state = self.core.states[tp.partition]
            end = ends.get(tp)
            replaced = self._replaced(tp.partition, current, "reports")
            if replaced or (end is not None and resume > end):
                # The checkpoint's close marker was read from the log its topic id names; another id, or
                # a log that ends before the marker, is a new log (a memory-only broker restarted;
                # durable Kafka never shrinks a log). Keep the checkpointed state and read the new log
                # from its start, however far it has grown meanwhile.
                log.warning(
                    "reports partition %d: %s: the broker lost or replaced the log (memory-only broker "
                    "restarted?). Keeping the checkpointed state (step %d closed) and reading the new log "
                    "from its start; reports in flight at the loss must be sent again.",
                    tp.partition,
                    replaced
                    or f"it ends at offset {end}, before its checkpoint's close marker "
                    f"(offset {resume - 1})",
                    state.closed,
                )
                state.offset = -1
                resume = 0
                self.core.inboxes[tp.partition].reset(
                    state.closed
                )  # the broker lost `repartition` too
                if replaced:
                    end = (
                        0  # whatever the new log holds now, the counted reports were on the old one
                    )
            self.core.log_ids[tp.partition] = {k: v for k, v in current.items() if v is not None}
            positions[tp] = resume
            lost = self.core.note_lost_log(tp.partition, previous.get(tp.partition), end)
            if lost:
                log.error(
                    "reports partition %d: the broker lost reports this worker had counted (users reported per "
                    "open step before the loss: %s; the log ends at %s, the last count was at offset %d): they "
                    "are not in the state and must be sent again; `dpstream close` refuses those steps until "
                    "then (or --force)",
                    tp.partition,
                    lost,
                    end,
                    previous[tp.partition].get("offset", -1),
                )
            snapshots[tp.partition] = self.core.intake_snapshot(tp.partition)
            observe_partition(tp.partition, state)
            log.info(
                "partition %d at step %d, consuming from offset %d",
                tp.partition,
                state.closed,
                resume,
            )
        await self.store.save_intake(
            snapshots
        )  # status/close show what the restored state holds, from now on
        return positions

    def _replaced(self, partition: int, current: dict[str, str | None], topic: str) -> str | None:
        """Why the ``topic`` log of ``partition`` is not the one its checkpoint's offsets are in (None: it
        is, or one of the two has no topic id)."""
        recorded = self.core.restored_logs.get(partition, {}).get(topic)
        if recorded is None or current.get(topic) is None or recorded == current[topic]:
            return None
        return f"its topic id is {current[topic]}, the checkpoint's offsets are in log {recorded}"

    def _forwarded_position(self, tp, end: int | None, replaced: str | None = None) -> int:
        """Where to read the partition's `repartition` log from: its checkpoint's resume offset."""
        inbox = self.core.inboxes.get(tp.partition)
        if inbox is None:
            return 0
        resume = inbox.resume()
        if replaced or (
            end is not None and resume > end
        ):  # lost with a memory-only broker, as for reports
            log.warning(
                "repartition partition %d: %s: reading the new log from its start",
                tp.partition,
                replaced or f"it ends at offset {end}, before its checkpoint ({resume})",
            )
            inbox.reset(self.core.states[tp.partition].closed)
            resume = 0
        return resume

    async def on_revoke(self, tps) -> None:
        async with self.busy:
            for tp in tps:
                if tp.topic == self.names["reports"]:
                    self.core.revoke(tp.partition)
                    forget_partition(tp.partition)

    # -- one fetch ---------------------------------------------------------------------------------
    async def handle(self, batch: dict) -> None:
        """Feedback first (a close in the same fetch may wait for it), then reports, partition by partition."""
        async with self.busy:
            touched = set()
            for tp, messages in batch.items():
                if tp.topic == self.names["feedback"] and tp.partition in self.core.states:
                    self.feedback_done[tp.partition] = messages[-1].offset + 1
                    if any([self.core.apply_feedback(tp.partition, m.value) for m in messages]):
                        observe_partition(tp.partition, self.core.states[tp.partition])
                        touched.add(tp.partition)
            due = self.core.feedback_checkpoints()
            if due:
                await (
                    self._forwards_acknowledged()
                )  # a checkpoint covers the reports forwarded so far
            for partition, blob in due.items():
                await self.store.save_checkpoint(
                    partition, blob, None, self.core.take_dropped(partition)
                )
            for tp, messages in batch.items():
                if (
                    tp.topic not in (self.names["reports"], self.names["repartition"])
                    or tp.partition not in self.core.states
                ):
                    continue  # revoked meanwhile: its new owner replays it
                enqueue = (
                    self.core.enqueue
                    if tp.topic == self.names["reports"]
                    else self.core.enqueue_forwarded
                )
                rewind = enqueue(tp.partition, messages)
                if rewind is not None:
                    log.warning(
                        "partition %d: fetched from offset %d, past the next offset to handle (%d): seeking "
                        "back",
                        tp.partition,
                        messages[0].offset,
                        rewind,
                    )
                    self.seek(tp, rewind)
                    continue
                touched.add(tp.partition)
            await self.drain(sorted(touched))

    async def drain(self, partitions: list[int]) -> None:
        """Handle the partitions' backlogs; publish everything, then write the checkpoints.

        A checkpoint is written only once the broker has acknowledged the partials and dead letters
        before it (:class:`CommitOrder` keeps that order). The partials of every partition go out before
        any checkpoint, which keeps checkpoint writes off the release's critical path; only a
        partition's last checkpoint of the fetch is written.

        Forwarded reports are the exception to waiting at the end of the fetch: their
        acknowledgements are awaited at the end of the next fetch, or before anything that depends
        on them — forwarded-through markers and any checkpoint (a checkpoint must not cover a
        report whose forward the broker may still refuse) — so a worker forwarding most of its
        reports never idles on a round trip per fetch. The intake counts (curator-side, for
        ``dpstream status``) are written without waiting for them: a crash before the
        acknowledgement replays the source from its checkpoint, which restores and recounts them.
        """
        started = time.perf_counter()
        sends, forwards = self.commit_order.begin(), self.commit_order.begin()
        checkpoints: dict[int, CloseOutput] = {}  # partition -> its last close of this fetch
        forwarded: set[int] = set()  # open steps with reports forwarded in this fetch
        for partition in partitions:
            for out in self.core.drain_all(partition):
                if isinstance(out, ForwardMarkers):
                    # everything forwarded before the close marker is acknowledged before the markers go;
                    # nothing else is waited for (with no forwards in flight, as for murmur2 producers,
                    # the markers go at once)
                    await self._forwards_acknowledged(forwards, forwarded)
                    for p, value, headers in out.messages:
                        await sends.send(
                            self.names["repartition"], value, headers=headers, partition=p
                        )
                elif isinstance(out, CloseOutput):
                    if out.checkpoint:
                        crash_point("worker.before_partial", out.step)
                    for key, value in out.messages:
                        await sends.send(self.names["step-partials"], value, key=key)
                    if out.checkpoint:  # empty for a replayed close of a step already closed
                        earlier = checkpoints.get(
                            partition
                        )  # only the last checkpoint is written: with
                        if earlier is not None:  # the kept partials of every close of the fetch
                            out.kept = {
                                **{t: b for t, b in earlier.kept.items() if t not in out.dropped},
                                **out.kept,
                            }
                            out.dropped = sorted(set(earlier.dropped) | set(out.dropped))
                        checkpoints[partition] = out
                        log.info(
                            "partition %d closed step %d: %s", out.partition, out.step, out.summary
                        )
                else:
                    await self._apply(out, sends, forwards)
                    if out.forwards:
                        forwarded.add(self.core.states[partition].closed + 1)

        async def save(out: CloseOutput) -> None:
            crash_point("worker.before_checkpoint", out.step)
            await self.store.save_checkpoint(out.partition, out.checkpoint, out.kept, out.dropped)
            METRICS.step_close_seconds.observe(time.perf_counter() - started)
            METRICS.open_step.labels(str(out.partition)).set(out.step + 1)

        await sends.acknowledged()
        await self._forwards_acknowledged(forwards, forwarded, keep=not checkpoints)
        if checkpoints:
            log.info("partials acknowledged: %s", {p: out.step for p, out in checkpoints.items()})
        # then the checkpoints, and the intake counts for `dpstream status` / `close` (a replay restores
        # and recounts them exactly)
        await sends.commit(
            *[lambda out=out: save(out) for out in checkpoints.values()],
            lambda: self.store.save_intake(
                {p: self.core.intake_snapshot(p) for p in partitions if p in self.core.states}
            ),
        )

    async def _forwards_acknowledged(
        self,
        current: Batch | None = None,
        steps: AbstractSet[int] = frozenset(),
        keep: bool = False,
    ) -> None:
        """Wait for the forwards in flight since the previous fetch, then for ``current`` (this fetch's,
        of reports of the open ``steps``) — or, with ``keep``, leave those in flight until the next fetch."""
        previous, self.forwarding = self.forwarding, None
        for batch, batch_steps in [
            *([previous] if previous else []),
            *([(current, steps)] if current else []),
        ]:
            if keep and batch is current:
                self.forwarding = (current, set(steps)) if steps else None
                continue
            await batch.acknowledged()
            for step in sorted(batch_steps):
                crash_point("worker.after_forward", step)

    async def _apply(self, result: ApplyResult, sends: Batch, forwards: Batch) -> None:
        METRICS.reports.labels("accepted").inc(result.accepted)
        if result.forwarded:
            METRICS.reports.labels("forwarded").inc(result.forwarded)
        for reason, count in result.reasons.items():
            METRICS.reports.labels("rejected").inc(count)
            METRICS.dead_letters.labels(reason).inc(count)
        await sends.send_many(self.names["dead-letter"], result.dead_letters)
        for p, value, headers in result.forwards:
            await forwards.send(self.names["repartition"], value, headers=headers, partition=p)

    def handled(self, assignment) -> dict[Any, int]:
        """Next offset to handle per assigned partition (committed for the lag gauge only)."""
        out = {}
        for tp in assignment:
            state = self.core.states.get(tp.partition)
            if tp.topic == self.names["reports"] and state is not None:
                out[tp] = state.offset + 1
            elif tp.topic == self.names["feedback"]:
                out[tp] = self.feedback_done.get(tp.partition, 0)
            elif tp.topic == self.names["repartition"] and tp.partition in self.core.inboxes:
                out[tp] = self.core.inboxes[tp.partition].resume()
        return out
