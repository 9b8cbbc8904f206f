"""Ingest worker: reports -> per-user numpy state -> step partials.

Run through the command line (``pipeline.stream.kafka.runtime`` lists the job's arguments):
``dpstream worker --config config/sipp-poverty.yaml``. Start up to as many as there are partitions.

* ``reports`` (keyed by user): runs of reports are parsed and applied in bulk; a close marker for
  step t (header ``dpstream-control: close``) closes step t in that partition: impute, compute the
  partial aggregates, publish them to ``step-partials``, checkpoint state + marker offset to Redis.
* ``feedback`` (co-partitioned with reports): heavy-hitter flags of step t, applied before step
  t+1 closes (the close waits for them).
* ``repartition`` (co-partitioned with reports): reports of this partition's users that arrived on
  other partitions, and their forwarded-through markers; a close waits for those of every source
  (:mod:`pipeline.stream.ingest.repartition`). Reports of other partitions' users are forwarded there.
* rejected reports -> ``dead-letter`` with the original bytes and a reason.

Transport: a plain aiokafka group consumer reading whole fetches (:mod:`pipeline.stream.kafka.consumer`) and
an aiokafka producer; the hot path is vectorised per fetch (docs/streaming.md, "Processes").
Positions come only from the Redis checkpoints (read in the assignment callback); the offsets this
worker commits are for lag monitoring, never read back.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from aiokafka import TopicPartition

from pipeline.stream.ingest.core import ApplyResult, CloseOutput, IngestCore
from pipeline.stream.ingest.repartition import ForwardMarkers
from pipeline.stream.kafka.consumer import BulkConsumer
from pipeline.stream.kafka.faults import crash_point
from pipeline.stream.kafka.log_end import log_ends_async
from pipeline.stream.kafka.metrics import METRICS, forget_partition, observe_partition, serve_metrics
from pipeline.stream.kafka.process import make_producer, run_job, supervise
from pipeline.stream.kafka.runtime import Runtime
from pipeline.stream.kafka.topics import INGEST, group_id, read_by
from pipeline.stream.state.checkpoint import Checkpoint
from pipeline.stream.state.identity import establish_identity

log = logging.getLogger("dpstream.worker")


class IngestWorker:
    """One ingest process: the consumer, the producer, and the transport-free :class:`IngestCore`."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.names = rt.names
        self.store = rt.store()
        # Aggregators are rebuilt from this configuration around restored state: it must be the one the
        # state was created under (ConfigurationChanged: exit code 2).
        establish_identity(rt.deployment, rt.roster.ids, self.store, "worker")
        self.core = IngestCore(rt.deployment, rt.roster, self.names, store=self.store)
        self.consumer = BulkConsumer(rt.broker, group_id(rt.deployment, INGEST),
                                     [self.names[t] for t in read_by(INGEST)],
                                     on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.producer = make_producer(rt.broker, linger_ms=5)
        self.checkpoint = Checkpoint(self.producer)  # partials and dead letters acknowledged, then Redis
        self.redis = rt.async_store()  # checkpoint writes from the event loop
        # Held while a fetch is handled: a revocation waits for it, so a partition's old owner has
        # written its last checkpoint before the new owner reads it.
        self._busy = asyncio.Lock()
        self._feedback_done: dict[int, int] = {}  # feedback partition -> next offset (lag metric only)
        # The roster, its id index and the loaded modules live as long as the process: frozen out of
        # the cyclic collector's sight, so the full passes the fetches' allocations trigger skip them.
        gc.freeze()

    # -- assignment ------------------------------------------------------------------------------
    async def _on_assign(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        positions = {}
        reports = [tp for tp in tps if tp.topic == self.names["reports"]]
        forwarded = [tp for tp in tps if tp.topic == self.names["repartition"]]
        # True log ends (the embedded broker's ListOffsets answer is short by the rest of the last
        # batch, which would look like a lost log when the checkpoint's marker is in that batch).
        ends = await log_ends_async(self.rt.broker, reports + forwarded, "resuming at the checkpoints")
        previous = await self.redis.intake_of(tp.partition for tp in reports)  # the counts before this assignment
        snapshots = {}
        for tp in sorted(tps, key=lambda tp: tp.topic == self.names["repartition"]):  # reports partitions first
            if tp.topic == self.names["repartition"]:
                positions[tp] = self._forwarded_position(tp, ends.get(tp))
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
            if end is not None and resume > end:
                # The checkpoint's close marker was read from this log, so the log ends after it; one
                # that ends before it was lost (a memory-only broker restarted; durable Kafka never
                # shrinks a log). Keep the checkpointed state and read the new log from its start.
                log.warning("reports partition %d ends at offset %d, before its checkpoint's close marker (offset "
                            "%d): the broker lost the log (memory-only broker restarted?). Keeping the checkpointed "
                            "state (step %d closed) and reading the new log from its start; reports in flight at "
                            "the loss must be sent again.", tp.partition, end, resume - 1, state.closed)
                state.offset = -1
                resume = 0
                self.core.inboxes[tp.partition].reset(state.closed)  # the broker lost `repartition` too
            positions[tp] = resume
            lost = self.core.note_lost_log(tp.partition, previous.get(tp.partition), end)
            if lost:
                log.error("reports partition %d: the broker lost reports this worker had counted (users reported per "
                          "open step before the loss: %s; the log ends at %s, the last count was at offset %d): they "
                          "are not in the state and must be sent again; `dpstream close` refuses those steps until "
                          "then (or --force)",
                          tp.partition, lost, end, previous[tp.partition].get("offset", -1))
            snapshots[tp.partition] = self.core.intake_snapshot(tp.partition)
            observe_partition(tp.partition, state)
            log.info("partition %d at step %d, consuming from offset %d", tp.partition, state.closed, resume)
        await self.redis.save_intake(snapshots)  # status/close show what the restored state holds, from now on
        return positions

    def _forwarded_position(self, tp: TopicPartition, end: int | None) -> int:
        """Where to read the partition's `repartition` log from: its checkpoint's resume offset."""
        inbox = self.core.inboxes.get(tp.partition)
        if inbox is None:
            return 0
        resume = inbox.resume()
        if end is not None and resume > end:  # lost with a memory-only broker, as for reports
            log.warning("repartition partition %d ends at offset %d, before its checkpoint (%d): reading the new log "
                        "from its start", tp.partition, end, resume)
            inbox.reset(self.core.states[tp.partition].closed)
            resume = 0
        return resume

    async def _on_revoke(self, tps: set[TopicPartition]) -> None:
        async with self._busy:
            for tp in tps:
                if tp.topic == self.names["reports"]:
                    self.core.revoke(tp.partition)
                    forget_partition(tp.partition)

    # -- one fetch ---------------------------------------------------------------------------------
    async def handle(self, batch: dict[TopicPartition, list]) -> None:
        """Feedback first (a close in the same fetch may wait for it), then reports, partition by partition."""
        async with self._busy:
            touched = set()
            for tp, messages in batch.items():
                if tp.topic == self.names["feedback"] and tp.partition in self.core.states:
                    self._feedback_done[tp.partition] = messages[-1].offset + 1
                    if any([self.core.apply_feedback(tp.partition, m.value) for m in messages]):
                        observe_partition(tp.partition, self.core.states[tp.partition])
                        touched.add(tp.partition)
            for partition, blob in self.core.feedback_checkpoints().items():
                await self.redis.save_checkpoint(partition, blob)
            for tp, messages in batch.items():
                if tp.topic not in (self.names["reports"], self.names["repartition"]) \
                        or tp.partition not in self.core.states:
                    continue  # revoked meanwhile: its new owner replays it
                # aiokafka's records carry .offset, .value and .headers, which is all a Record is
                enqueue = self.core.enqueue if tp.topic == self.names["reports"] else self.core.enqueue_forwarded
                rewind = enqueue(tp.partition, messages)
                if rewind is not None:
                    log.warning("partition %d: fetched from offset %d, past the next offset to handle (%d): seeking "
                                "back", tp.partition, messages[0].offset, rewind)
                    self.consumer.consumer.seek(tp, rewind)
                    continue
                touched.add(tp.partition)
            await self._drain(sorted(touched))

    async def _drain(self, partitions: list[int]) -> None:
        """Handle the partitions' backlogs; publish everything, then write the checkpoints.

        A checkpoint says "step closed, records up to its marker handled", so it is written only
        once the broker has acknowledged the partials and dead letters before it, or a crash in
        between would lose them (the replay starts after the marker): :class:`Checkpoint` keeps that
        order. The partials of every partition go out before any checkpoint, which keeps checkpoint
        writes off the release's critical path; only a partition's last checkpoint of the fetch is written.
        """
        started = time.perf_counter()
        sends, checkpoints, forwarding = self.checkpoint.begin(), {}, set()
        for partition in partitions:
            for out in self.core.drain_all(partition):
                if isinstance(out, ForwardMarkers):
                    # everything forwarded before the close marker is acknowledged before the markers go
                    await sends.acknowledged()
                    for p, value, headers in out.messages:
                        await sends.send(self.names["repartition"], value, headers=headers, partition=p)
                elif isinstance(out, CloseOutput):
                    if out.checkpoint:
                        crash_point("worker.before_partial", out.step)
                    for key, value in out.messages:
                        await sends.send(self.names["step-partials"], value, key=key)
                    if out.checkpoint:  # empty for a replayed close of a step already closed
                        checkpoints[partition] = out
                        log.info("partition %d closed step %d: %s", out.partition, out.step, out.summary)
                else:
                    await self._apply(out, sends)
                    if out.forwards:
                        forwarding.add(self.core.states[partition].closed + 1)

        async def save(out: CloseOutput) -> None:
            crash_point("worker.before_checkpoint", out.step)
            await self.redis.save_checkpoint(out.partition, out.checkpoint)
            METRICS.step_close_seconds.observe(time.perf_counter() - started)
            METRICS.open_step.labels(str(out.partition)).set(out.step + 1)

        await sends.acknowledged()
        for step in sorted(forwarding):
            crash_point("worker.after_forward", step)
        if checkpoints:
            log.info("partials acknowledged: %s", {p: out.step for p, out in checkpoints.items()})
        # then the checkpoints, and the intake counts for `dpstream status` / `close` (a replay restores
        # and recounts them exactly)
        await sends.commit(*[lambda out=out: save(out) for out in checkpoints.values()],
                           lambda: self.redis.save_intake({p: self.core.intake_snapshot(p)
                                                           for p in partitions if p in self.core.states}))

    async def _apply(self, result: ApplyResult, sends) -> None:
        METRICS.reports.labels("accepted").inc(result.accepted)
        if result.forwarded:
            METRICS.reports.labels("forwarded").inc(result.forwarded)
        for reason, count in result.reasons.items():
            METRICS.reports.labels("rejected").inc(count)
            METRICS.dead_letters.labels(reason).inc(count)
        for key, value, headers in result.dead_letters:
            await sends.send(self.names["dead-letter"], value, key=key, headers=headers)
        for p, value, headers in result.forwards:
            await sends.send(self.names["repartition"], value, headers=headers, partition=p)

    def _handled(self) -> dict[TopicPartition, int]:
        """Next offset to handle per assigned partition (committed for the lag gauge only)."""
        out = {}
        for tp in self.consumer.consumer.assignment():
            state = self.core.states.get(tp.partition)
            if tp.topic == self.names["reports"] and state is not None:
                out[tp] = state.offset + 1
            elif tp.topic == self.names["feedback"]:
                out[tp] = self._feedback_done.get(tp.partition, 0)
            elif tp.topic == self.names["repartition"] and tp.partition in self.core.inboxes:
                out[tp] = self.core.inboxes[tp.partition].resume()
        return out

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        if self.rt.metrics_port:
            serve_metrics(self.rt.metrics_port)
        await self.producer.start()
        await self.consumer.start()
        log.info("worker started: group %s", self.consumer.group_id)
        try:
            if self.names["repartition"] not in await self.consumer.consumer.topics():
                # without it no close could ever gather the other partitions' forwarded-through markers
                raise RuntimeError(f"topic {self.names['repartition']} does not exist: create the deployment's topics "
                                   "(deploy/create_topics.py, or `dpstream up`) before starting workers")
            await supervise([asyncio.create_task(self._consume()),
                             asyncio.create_task(self.consumer.commit_loop(self._handled))], "worker",
                            drain=self._finish_fetch)
        finally:
            await self.consumer.stop()
            await self.producer.stop()
            await self.redis.close()
            log.info("worker stopped")

    async def _finish_fetch(self) -> None:
        """On SIGTERM: let the fetch in hand finish (its partials, checkpoints and intake counts written)."""
        async with self._busy:
            pass

    async def _consume(self) -> None:
        async for batch in self.consumer.batches():
            await self.handle(batch)


def serve(rt: Runtime, loglevel: str = "info") -> None:
    """Run a worker on a loaded configuration and endpoints until SIGTERM/SIGINT or a failure."""
    run_job(lambda: IngestWorker(rt).run(), loglevel)


def main(argv: list[str] | None = None) -> None:
    rt, loglevel = Runtime.from_args("worker", argv)
    serve(rt, loglevel)


if __name__ == "__main__":
    main()
