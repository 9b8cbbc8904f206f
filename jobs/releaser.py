"""Releaser (one instance): step partials -> noisy releases -> public topics.

Run through the command line: ``dpstream releaser --config config/sipp-poverty.yaml``.

* ``step-partials``: waits until every reports partition's partial of step t has arrived, runs the
  mechanisms (``ReleaseEngine``), commits the complete release — records, ledger entries, engine
  state — to Redis in one transaction, and only then publishes: manifests to ``releases``, the new
  synthetic columns in chunks to ``synthetic``, alerts to ``alerts``, flags to ``feedback``.
  A step whose record exists is republished from Redis, never recomputed.
* ``control``: ``{"command": "close", "step": t}`` writes a close marker to every partition of
  ``reports`` (for every step up to t not yet closed, in order). With ``steps.close: deadline`` the
  releaser also closes a step ``deadline_seconds`` after the previous close (:mod:`pipeline.stream.release.closing`).
  Every public record of a step carries the step's public close time as its timestamp, never the
  time it was computed or sent.

At start: the configuration is checked against the one the Redis state was created under
(:mod:`pipeline.stream.state.identity`, exit code 2), and before the first release the ``releases`` topic
is checked for releases the state does not know (:mod:`pipeline.stream.release.fence`, exit code 4).

Transport: an aiokafka group consumer (:mod:`pipeline.stream.kafka.consumer`) and producer. Positions come
from Redis (the partials resume offset) in the assignment callback (docs/streaming.md, "Processes").
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition

from pipeline.privacy.accounting import BudgetExhaustedError
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.kafka.consumer import BulkConsumer
from pipeline.stream.release.closing import DeadlineClock, now_ms
from pipeline.stream.release.engine import ReleaseEngine, ReleaseOutput
from pipeline.stream.kafka.faults import crash_point
from pipeline.stream.release.fence import check_fence, read_release_stamps
from pipeline.stream.state.identity import establish_identity
from pipeline.stream.kafka.codecs import CONTROL_HEADER, PartialAssembler, close_marker, synthetic_chunks
from pipeline.stream.kafka.metrics import METRICS, serve_metrics, start_lag_monitor
from pipeline.stream.kafka.process import make_producer, run_job, supervise
from pipeline.stream.kafka.runtime import Runtime
from pipeline.stream.state.store import StepAlreadyReleased, StepRecord

log = logging.getLogger("dpstream.releaser")

rt = Runtime.from_env()
dep = rt.deployment
names = rt.names
P = dep.topics.partitions

GROUP = f"dpstream-{dep.name}-releaser"
producer: AIOKafkaProducer | None = None  # created in main(), inside the running loop
consumer: BulkConsumer | None = None

store = rt.store()

# A restart must find the privacy-relevant configuration (budget plan included) the state was created
# under; a changed one is refused before anything runs (ConfigurationChanged: exit code 2).
identity = establish_identity(dep, rt.roster.ids, store, "releaser")

_last, _state_blob = store.latest_state()
engine = (ReleaseEngine.from_state(dep, loads_state(_state_blob, f"{store.key('step', _last)} __state__"))
          if _state_blob else ReleaseEngine(dep, rt.roster.n))
engine.instance = identity.instance  # stamped into every manifest: the fence reads it back
assembler = PartialAssembler(P)
_stopped_reason: str | None = None
_republished = False
_step_lock = asyncio.Lock()


def _send(topic: str, key: bytes | None, value: bytes, partition: int = 0, headers=None, timestamp_ms=None):
    return producer.send(names[topic], key=key, value=value, partition=partition, headers=headers,
                         timestamp_ms=timestamp_ms)


def _closed_at(outputs: list[ReleaseOutput]) -> float | None:
    """The step's public close time (seconds) as its manifests state it (``released_at``)."""
    return outputs[0].manifest.get("released_at") if outputs else None


def _public_timestamp(step: int, outputs: list[ReleaseOutput]) -> int | None:
    """The record timestamp of a step's messages: its public close time (from the manifests), the
    same on every republication. None only for a step closed by a marker without one (not written
    by this releaser): the client then stamps the send time."""
    released_at = _closed_at(outputs)
    if released_at is None:
        log.warning("step %d has no public close time: its records carry the send time", step)
        return None
    return round(released_at * 1000)


async def _send_all(sends) -> None:
    futures = [await coro for coro in sends]
    for fut in futures:
        await fut  # acknowledged by the broker


async def publish(step: int, outputs: list[ReleaseOutput]) -> None:
    """Publish a committed step (also used to republish after a restart: same bytes every time)."""
    sends = []
    ts = _public_timestamp(step, outputs)
    for out in outputs:
        key = f"{out.release}:{step}".encode()
        sends.append(_send("releases", key, orjson.dumps(out.manifest), timestamp_ms=ts))
        if out.columns is not None:
            for ckey, cval in synthetic_chunks(out.release, step, out.column_steps, out.columns):
                sends.append(_send("synthetic", ckey, cval, timestamp_ms=ts))
        if out.alerts is not None:
            sends.append(_send("alerts", key, orjson.dumps(out.alerts), timestamp_ms=ts))
        if out.feedback is not None:
            body = orjson.dumps({"release": out.release, "step": step, **out.feedback})
            for p in range(P):
                sends.append(_send("feedback", key, body, partition=p))
    half = len(sends) // 2
    await _send_all(sends[:half])
    crash_point("releaser.mid_publish", step)
    await _send_all(sends[half:])
    store.mark_published(step)
    METRICS.released_step.set(step)


def _record_outputs(record: StepRecord) -> list[ReleaseOutput]:
    return [ReleaseOutput.from_bytes(record.releases[rel.name], f"{store.key('step', record.step)} {rel.name}")
            for rel in dep.releases]


async def _log_end(topic: str) -> int | None:
    """End offset of partition 0 of ``topic`` (None when the broker cannot tell)."""
    from kafka import TopicPartition as KTopicPartition

    from pipeline.stream.kafka.log_end import log_ends

    tp = KTopicPartition(topic, 0)
    try:  # the true end: the embedded broker's ListOffsets answer is short (see pipeline.stream.kafka.log_end)
        return (await asyncio.to_thread(log_ends, rt.broker, [tp])).get(tp)
    except Exception as err:  # noqa: BLE001 - cannot tell: act as if nothing was lost
        log.warning("could not read the end of %s: %s", topic, err)
        return None


async def _republish_pending() -> None:
    """Republish steps committed but not (known to be) fully published before a crash: same bytes.

    If the broker lost the public log (a memory-only broker restarted: ``releases`` is empty although
    steps were published; durable Kafka never shrinks a log), every committed step is republished."""
    global _republished
    if _republished:
        return
    first = store.last_published() + 1
    if first > 1 and await _log_end(names["releases"]) == 0:
        log.warning("the broker lost the public topics (%s is empty, %d step(s) were published): republishing "
                    "every committed step from Redis", names["releases"], first - 1)
        first = 1
    for step in range(first, store.last_released() + 1):
        record = store.load_step(step)
        await publish(step, _record_outputs(record))
        METRICS.republished.inc()
        log.info("republished step %d from its stored record", step)
    _republished = True


async def release_ready_steps() -> None:
    global engine, _stopped_reason
    async with _step_lock:
        await _republish_pending()
        while _stopped_reason is None and assembler.complete(engine.step + 1):
            step = engine.step + 1
            started = time.perf_counter()
            partials = assembler.pop(step)
            try:
                outputs = engine.release(step, partials)
            except BudgetExhaustedError as err:
                _stopped_reason = str(err)
                METRICS.budget_refusals.labels(err.release).inc()
                log.error("budget exhausted, releases stopped: %s", err)
                return
            ledger = {f"{e.release}:{e.step}": e.get_state() for e in engine.ledger.entries if e.step == step}
            record = StepRecord(step, {o.release: o.to_bytes() for o in outputs}, dumps_state(engine.get_state()))
            computed = time.perf_counter()
            crash_point("releaser.before_commit", step)
            try:
                store.commit_step(record, ledger)
            except StepAlreadyReleased:
                # Someone (an earlier incarnation) committed it: the stored record is the release.
                record = store.load_step(step)
                engine = ReleaseEngine.from_state(dep, loads_state(record.state, f"{store.key('step', step)} __state__"))
                outputs = _record_outputs(record)
                METRICS.republished.inc()
            resume = assembler.min_offset()
            store.set_partials_resume(resume if resume is not None else _last_partial_offset + 1)
            committed = time.perf_counter()
            crash_point("releaser.after_commit", step)
            await _hold_until_public_time(step, outputs)
            await publish(step, outputs)
            _observe(step, outputs, started)
            log.info("released step %d (mechanisms %.3f s, Redis commit %.3f s, publish %.3f s)", step,
                     computed - started, committed - computed, time.perf_counter() - committed)


async def _hold_until_public_time(step: int, outputs: list[ReleaseOutput]) -> None:
    """With ``steps.publish_delay_seconds`` = L, publish step t at its public close time + L, so when
    its records appear does not depend on how long the release took (docs/privacy.md, "Closing
    rules and timing"). A release not ready by then is published at once and counted as an overrun
    (that it was late is then visible: choose L above the worst case)."""
    hold = dep.steps.publish_delay_seconds
    closed_at = _closed_at(outputs)
    if not hold or closed_at is None:
        return
    wait = closed_at + hold - time.time()
    if wait > 0:
        await asyncio.sleep(wait)
    else:
        METRICS.publish_overruns.inc()
        log.warning("step %d was ready %.3f s after close + publish_delay_seconds: published late", step, -wait)


def _observe(step: int, outputs: list[ReleaseOutput], started: float) -> None:
    METRICS.release_seconds.observe(time.perf_counter() - started)
    closed_at = _closed_at(outputs)
    if closed_at is not None:  # curator-side only: the public records carry the close time itself
        METRICS.close_to_publish_seconds.set(time.time() - closed_at)
        METRICS.close_to_publish_step.set(step)
    for out in outputs:
        priv = out.manifest.get("privacy", {}).get("release_spent") or {}
        if "rho" in priv:
            METRICS.privacy_rho.labels(out.release).set(priv["rho"])
        if "epsilon" in priv:
            METRICS.privacy_epsilon.labels(out.release).set(priv["epsilon"])
        if out.manifest.get("clamped_bins"):
            METRICS.padding_clamps.labels(out.release).inc(out.manifest["clamped_bins"])
        if out.alerts is not None and "flagged" in out.alerts:
            METRICS.heavy_hitters.labels(out.release).set(len(out.alerts["flagged"]))


_last_partial_offset = -1


async def _on_assign(tps: set[TopicPartition]) -> dict[TopicPartition, int]:
    """Positions from Redis, whatever the group committed: partials from the first one of a step not
    yet released (the resume offset), control commands from the start (closing is idempotent)."""
    global _republished, _last_partial_offset
    _republished = False  # after a rebalance (e.g. the broker came back), check the public log again
    positions = {}
    for tp in tps:
        if tp.topic == names["step-partials"]:
            resume = store.partials_resume()
            end = await _log_end(names["step-partials"])
            if end is not None and end < resume:  # a log never shrinks on durable Kafka
                log.warning("%s ends at offset %d, before the resume offset %d: the broker lost the log (memory-only "
                            "broker restarted?); reading the new log from its start", tp.topic, end, resume)
                resume, _last_partial_offset = 0, -1
            positions[tp] = resume
            log.info("reading %s from offset %d", tp.topic, resume)
        elif tp.topic == names["control"]:
            positions[tp] = 0
    return positions


async def _on_revoke(tps: set[TopicPartition]) -> None:
    pass  # the assembler keeps what it has: re-read chunks are duplicates, which it ignores


_control_done = 0  # next control offset to handle (lag gauge only)


def _handled() -> dict[TopicPartition, int]:
    return {TopicPartition(names["step-partials"], 0): _last_partial_offset + 1,
            TopicPartition(names["control"], 0): _control_done}


def _take_partial(offset: int, key: bytes | None, value: bytes) -> bool:
    """Handle one step-partials message (duplicates are harmless); True when it may complete a step."""
    global _last_partial_offset
    _last_partial_offset = max(_last_partial_offset, offset)
    if (key or b"").startswith(b"progress:"):
        return False  # coverage progress of an earlier version (closing by coverage is refused now)
    step = assembler.add(value, offset)
    if step <= engine.step:
        assembler.discard_before(engine.step + 1)  # a replayed partial of a released step
        return False
    if assembler.complete(step):
        log.info("partials of step %d complete", step)
    return True


# -- closing steps ----------------------------------------------------------------------------------
async def close_through(step: int, closed_at: int) -> None:
    """Write close markers for every step after the last one closed, up to ``step``, in order, each
    carrying the public close time ``closed_at`` (ms)."""
    if not 1 <= step <= dep.horizon:
        log.error("refusing to close step %s: steps are 1..%d", step, dep.horizon)
        return
    first = store.last_closing() + 1
    for t in range(first, step + 1):
        body = close_marker(t, closed_at)
        await _send_all(_send("reports", None, body, partition=p, headers=[(CONTROL_HEADER, b"close")])
                        for p in range(P))
        store.mark_closing(t)
        log.info("close markers for step %d written to %d partitions", t, P)
    if first <= step:
        _deadline.closed(closed_at)


# The first step's deadline counts from the releaser's start (a public event), later ones from the
# previous close; no report is ever looked at.
_deadline = DeadlineClock(dep.steps.deadline_seconds if dep.steps.close == "deadline" else None, now_ms())


async def on_control(value: bytes, timestamp_ms: int) -> None:
    """A close command: its record timestamp (set by the operator's client) is the public close time."""
    try:
        cmd = orjson.loads(value)
        if cmd.get("command") != "close":
            raise ValueError(f"unknown command {cmd.get('command')!r}")
        log.info("close command for step %s", cmd.get("step"))
        await close_through(int(cmd["step"]), timestamp_ms if timestamp_ms >= 0 else now_ms())
    except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as err:
        log.error("ignoring control message %r: %s", value[:200], err)


async def auto_close() -> None:
    step = store.last_closing() + 1
    due = _deadline.due(now_ms())
    if due is not None and step <= dep.horizon:
        await close_through(step, due)


async def _consume() -> None:
    global _control_done
    async for batch in consumer.batches():
        for tp, messages in batch.items():
            if tp.topic == names["step-partials"]:
                if any([_take_partial(m.offset, m.key, m.value) for m in messages]):
                    await release_ready_steps()
            elif tp.topic == names["control"]:
                for m in messages:
                    await on_control(m.value, m.timestamp)
                _control_done = messages[-1].offset + 1


async def _every(seconds: float, fn) -> None:
    """Run ``fn`` every ``seconds``: closing by deadline, and republishing after a rebalance."""
    while True:
        await asyncio.sleep(seconds)
        await fn()


async def _republish_if_needed() -> None:
    if not _republished:
        await release_ready_steps()


async def _fence() -> None:
    """Before the first release: refuse (StateLost: exit code 4) when ``releases`` holds releases this
    state does not know — the Redis state was lost or replaced, and releasing would redraw noise."""
    stamps = await read_release_stamps(rt.broker, names["releases"])
    check_fence(stamps, identity.instance, store.last_released(), names["releases"])
    log.info("fence passed: %d manifest(s) on %s, none unknown to this state (instance %s, released through "
             "step %d)", len(stamps), names["releases"], identity.instance, store.last_released())


async def run() -> None:
    global producer, consumer
    serve_metrics(rt.metrics_port)
    start_lag_monitor(rt)  # one process exports the lag, so each series exists once
    producer = make_producer(rt.broker, linger_ms=2)
    consumer = BulkConsumer(rt.broker, GROUP, [names["step-partials"], names["control"]],
                            on_assign=_on_assign, on_revoke=_on_revoke)
    await producer.start()
    await consumer.start()
    log.info("releaser started: group %s, engine at step %d", GROUP, engine.step)
    try:
        await _fence()
        await release_ready_steps()  # republishes first, under the same lock as releasing
        # any task failing (e.g. Redis gone) ends the process with an error
        await supervise([asyncio.create_task(_consume()), asyncio.create_task(_every(0.5, auto_close)),
                         asyncio.create_task(_every(1.0, _republish_if_needed)),
                         asyncio.create_task(consumer.commit_loop(_handled))], "releaser")
    finally:
        await consumer.stop()
        await producer.stop()
        log.info("releaser stopped")


def main(loglevel: str = "info") -> None:
    run_job(run, loglevel)


if __name__ == "__main__":
    main()
