"""Ingest worker (Faust app): reports -> per-user numpy state -> step partials.

Run through the command line (which sets the environment, see ``pipeline.stream.runtime``):
``dpstream worker --config config/sipp-poverty.yaml``. Start as many as there are partitions.

* ``reports`` (keyed by user): runs of reports are parsed and applied in bulk; a close marker for
  step t (header ``dpstream-control: close``) closes step t in that partition: impute, compute the
  partial aggregates, publish them to ``step-partials``, checkpoint state + marker offset to Redis.
* ``feedback`` (co-partitioned with reports): heavy-hitter flags of step t, applied before step
  t+1 closes (the close waits for them).
* rejected reports -> ``dead-letter`` with the original bytes and a reason.
"""

from __future__ import annotations

import asyncio
import logging
import time

import faust
from faust.types import TP

from pipeline.stream.faults import crash_point
from pipeline.stream.ingest import CloseOutput, IngestCore, Record
from pipeline.serialization import dumps_state
from pipeline.stream.metrics import METRICS, forget_partition, observe_partition, serve_metrics
from pipeline.stream.runtime import Runtime
from pipeline.stream.topics import read_partition

log = logging.getLogger("dpstream.worker")

rt = Runtime.from_env()
names = rt.names
P = rt.deployment.topics.partitions

app = faust.App(f"dpstream-{rt.deployment.name}-ingest", **rt.faust_settings())

reports_topic = app.topic(names["reports"], key_type=bytes, value_type=bytes,
                          key_serializer="raw", value_serializer="raw", partitions=P)
feedback_topic = app.topic(names["feedback"], key_type=bytes, value_type=bytes,
                           key_serializer="raw", value_serializer="raw", partitions=P)
partials_topic = app.topic(names["step-partials"], key_serializer="raw", value_serializer="raw", partitions=1)
dead_letter_topic = app.topic(names["dead-letter"], key_serializer="raw", value_serializer="raw", partitions=1)

store = rt.store()
core = IngestCore(rt.deployment, rt.roster, names, store=store)


@app.on_partitions_assigned.connect
async def _restore(sender, assigned, **kwargs) -> None:
    """Restore each newly assigned partition from its checkpoint and replay from the marker after it."""
    for tp in assigned:
        if tp.topic == names["feedback"]:
            # Re-read feedback from the start (one small message per release and step): a crash
            # between consuming a feedback message and checkpointing must not strand a close.
            # Messages for steps other than the last closed one are ignored.
            await app.consumer.seek(tp, 0)
            continue
        if tp.topic != names["reports"] or tp.partition in core.states:
            continue
        resume = core.assign(tp.partition)
        observe_partition(tp.partition, core.states[tp.partition])
        if core.feedback_outstanding(tp.partition):
            _recover_feedback_of.add(tp.partition)
        if resume:
            _check_log[tp.partition] = resume  # checked against the log's end by _check_restored_logs
        await app.consumer.seek(tp, resume)
        log.info("partition %d at step %d, consuming from offset %d",
                 tp.partition, core.states[tp.partition].closed, resume)


_check_log: dict[int, int] = {}  # partition -> resume offset of its restored checkpoint, not yet checked


async def _rebase_if_log_lost(partition: int, resume: int) -> None:
    """The checkpoint's close marker was read from the log, so the log ends after it; a log that ends
    before it was lost (a memory-only broker restarted: durable Kafka never shrinks a log). Keep the
    checkpointed state and read the new log from its start instead of skipping its first messages."""
    tp = TP(names["reports"], partition)
    try:
        end = (await app.consumer.highwaters(tp)).get(tp)
    except Exception as err:  # noqa: BLE001 - cannot tell: keep the checkpoint's position
        log.warning("partition %d: could not read the log end (%s)", partition, err)
        return
    if end is None or resume <= end or partition not in core.states:
        return
    log.warning("reports partition %d ends at offset %d, before its checkpoint's close marker (offset %d): the broker "
                "lost the log (memory-only broker restarted?). Keeping the checkpointed state (step %d closed) and "
                "reading the new log from its start; reports in flight at the loss must be sent again.",
                partition, end, resume - 1, core.states[partition].closed)
    core.states[partition].offset = -1
    core.backlog[partition].clear()
    await app.consumer.seek(tp, 0)  # also lets Faust deliver offsets below the checkpoint's again


@app.timer(interval=1.0)
async def _check_restored_logs() -> None:
    """Compare restored checkpoints with their logs' ends, outside the rebalance callback."""
    for partition in list(_check_log):
        await _rebase_if_log_lost(partition, _check_log.pop(partition))


@app.on_partitions_revoked.connect
async def _revoke(sender, revoked, **kwargs) -> None:
    for tp in revoked:
        if tp.topic == names["reports"]:
            core.revoke(tp.partition)
            forget_partition(tp.partition)


_locks: dict[int, asyncio.Lock] = {}


async def _drain(partition: int) -> None:
    """Handle a partition's backlog; publish outputs in log order (one drain per partition at a time)."""
    lock = _locks.setdefault(partition, asyncio.Lock())
    async with lock:
        while True:
            outputs = core.drain(partition) if partition in core.states else []
            if not outputs:
                return
            for out in outputs:
                if isinstance(out, CloseOutput):
                    await _publish_close(out)
                else:
                    await _publish_apply(out)


async def _publish_apply(result) -> None:
    METRICS.reports.labels("accepted").inc(result.accepted)
    for reason, count in result.reasons.items():
        METRICS.reports.labels("rejected").inc(count)
        METRICS.dead_letters.labels(reason).inc(count)
    for key, value, headers in result.dead_letters:
        await dead_letter_topic.send(key=key, value=value, headers=headers)
    if rt.deployment.steps.close == "coverage" and result.partition in core.states:
        state = core.states[result.partition]
        body = dumps_state({"partition": result.partition, "step": state.closed + 1, "reported": state.coverage()})
        await partials_topic.send(key=f"progress:{result.partition}".encode(), value=body, partition=0)


async def _publish_close(out: CloseOutput) -> None:
    # The checkpoint says "step closed"; write it only once the broker has acknowledged the partial,
    # or a crash in between would leave the releaser waiting for a partial nobody will resend.
    started = time.perf_counter()
    futures = [await partials_topic.send(key=key, value=value, partition=0) for key, value in out.messages]
    for fut in futures:
        await fut
    crash_point("worker.before_checkpoint", out.step)
    if out.checkpoint:
        store.save_checkpoint(out.partition, out.checkpoint)
        METRICS.step_close_seconds.observe(time.perf_counter() - started)
        METRICS.open_step.labels(str(out.partition)).set(out.step + 1)
        log.info("partition %d closed step %d: %s", out.partition, out.step, out.summary)


@app.agent(reports_topic)
async def ingest(stream):
    async for events in stream.take_events(20_000, within=0.05):
        runs: dict[int, list[Record]] = {}
        for ev in events:
            msg = ev.message
            runs.setdefault(msg.partition, []).append(Record(msg.offset, msg.value, tuple(msg.headers or ())))
        for partition, records in runs.items():
            if partition not in core.states:  # revoked meanwhile: its new owner replays it
                continue
            rewind = core.enqueue(partition, records)
            if rewind is not None:
                # Faust seeks a newly assigned partition to the group's committed offset after the
                # assignment callback, undoing the seek to the checkpoint when it had committed past it
                log.warning("partition %d: consumer at offset %d, past the next offset to handle (%d): seeking back",
                            partition, records[0].offset, rewind)
                await app.consumer.seek(TP(names["reports"], partition), rewind)
                continue
            await _drain(partition)


@app.agent(feedback_topic)
async def feedback(stream):
    async for event in stream.events():
        partition = event.message.partition
        if core.apply_feedback(partition, event.value):
            observe_partition(partition, core.states[partition])
            await _drain(partition)  # a close may have been waiting for this feedback


_recover_feedback_of: set[int] = set()  # restored partitions whose close waits for feedback


@app.timer(interval=1.0)
async def _recover_feedback() -> None:
    """A restored checkpoint may wait for feedback another worker already consumed and committed;
    Faust undoes a seek of the feedback partition back to 0, so read it directly instead. Only the
    last closed step's feedback applies, once per release (apply_feedback ignores the rest)."""
    for partition in sorted(_recover_feedback_of):
        _recover_feedback_of.discard(partition)
        if partition not in core.states or not core.feedback_outstanding(partition):
            continue
        messages, _ = await asyncio.to_thread(read_partition, rt.broker, names["feedback"], partition)
        if any([core.apply_feedback(partition, value) for _, _, value in messages]):
            observe_partition(partition, core.states[partition])
            await _drain(partition)


@app.task
async def _metrics() -> None:
    serve_metrics(rt.metrics_port)


if __name__ == "__main__":
    app.main()
