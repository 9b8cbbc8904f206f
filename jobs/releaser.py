"""Releaser (one instance): step partials -> noisy releases -> public topics.

Run through the command line: ``dpstream releaser --config config/sipp-poverty.yaml``.

* ``step-partials``: waits until every reports partition's partial of step t has arrived, runs the
  mechanisms (``ReleaseEngine``), commits the complete release — records, ledger entries, engine
  state — to Redis in one transaction, and only then publishes: manifests to ``releases``, the new
  synthetic columns in chunks to ``synthetic``, alerts to ``alerts``, flags to ``feedback``.
  A step whose record exists is republished from Redis, never recomputed.
* ``control``: ``{"command": "close", "step": t}`` writes a close marker to every partition of
  ``reports`` (for every step up to t not yet closed, in order). With ``steps.close: coverage`` or
  ``deadline`` the releaser also closes steps by itself.

At start: the configuration is checked against the one the Redis state was created under
(:mod:`pipeline.stream.identity`, exit code 2), and before the first release the ``releases`` topic
is checked for releases the state does not know (:mod:`pipeline.stream.fence`, exit code 4).

Transport: an aiokafka group consumer (:mod:`pipeline.stream.bulk`) and producer. Positions come
from Redis (the partials resume offset) in the assignment callback; Faust, used here before,
moved a new assignment back to the committed offset and added 0.6-0.8 s per hop on an idle topic
(measured), more than the whole release latency budget.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition

from pipeline.privacy.accounting import BudgetExhaustedError
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.bulk import BulkConsumer
from pipeline.stream.engine import ReleaseEngine, ReleaseOutput
from pipeline.stream.faults import crash_point
from pipeline.stream.fence import check_fence, read_release_stamps
from pipeline.stream.identity import establish_identity
from pipeline.stream.messages import CONTROL_HEADER, PartialAssembler, synthetic_chunks
from pipeline.stream.metrics import METRICS, serve_metrics, start_lag_monitor
from pipeline.stream.process import make_producer, run_job, supervise
from pipeline.stream.runtime import Runtime
from pipeline.stream.store import StepAlreadyReleased, StepRecord

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
engine = ReleaseEngine.from_state(dep, loads_state(_state_blob)) if _state_blob else ReleaseEngine(dep, rt.roster.n)
engine.instance = identity.instance  # stamped into every manifest: the fence reads it back
assembler = PartialAssembler(P)
_stopped_reason: str | None = None
_republished = False
_step_lock = asyncio.Lock()


def _send(topic: str, key: bytes | None, value: bytes, partition: int = 0, headers=None):
    return producer.send(names[topic], key=key, value=value, partition=partition, headers=headers)


async def _send_all(sends) -> None:
    futures = [await coro for coro in sends]
    for fut in futures:
        await fut  # acknowledged by the broker


async def publish(step: int, outputs: list[ReleaseOutput]) -> None:
    """Publish a committed step (also used to republish after a restart: same bytes every time)."""
    sends = []
    for out in outputs:
        key = f"{out.release}:{step}".encode()
        sends.append(_send("releases", key, orjson.dumps(out.manifest)))
        if out.columns is not None:
            for ckey, cval in synthetic_chunks(out.release, step, out.column_steps, out.columns):
                sends.append(_send("synthetic", ckey, cval))
        if out.alerts is not None:
            sends.append(_send("alerts", key, orjson.dumps(out.alerts)))
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
    return [ReleaseOutput.from_bytes(record.releases[rel.name]) for rel in dep.releases]


async def _log_end(topic: str) -> int | None:
    """End offset of partition 0 of ``topic`` (None when the broker cannot tell)."""
    from kafka import TopicPartition as KTopicPartition

    from pipeline.stream.log_end import log_ends

    tp = KTopicPartition(topic, 0)
    try:  # the true end: the embedded broker's ListOffsets answer is short (see pipeline.stream.log_end)
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
                engine = ReleaseEngine.from_state(dep, loads_state(record.state))
                outputs = _record_outputs(record)
                METRICS.republished.inc()
            resume = assembler.min_offset()
            store.set_partials_resume(resume if resume is not None else _last_partial_offset + 1)
            committed = time.perf_counter()
            crash_point("releaser.after_commit", step)
            await publish(step, outputs)
            _observe(outputs, started)
            log.info("released step %d (mechanisms %.3f s, Redis commit %.3f s, publish %.3f s)", step,
                     computed - started, committed - computed, time.perf_counter() - committed)


def _observe(outputs: list[ReleaseOutput], started: float) -> None:
    METRICS.release_seconds.observe(time.perf_counter() - started)
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
        _on_progress(value)
        return False
    step = assembler.add(value, offset)
    if step <= engine.step:
        assembler.discard_before(engine.step + 1)  # a replayed partial of a released step
        return False
    if assembler.complete(step):
        log.info("partials of step %d complete", step)
    return True


# -- closing steps ----------------------------------------------------------------------------------
async def close_through(step: int) -> None:
    """Write close markers for every step after the last one closed, up to ``step``, in order."""
    if not 1 <= step <= dep.horizon:
        log.error("refusing to close step %s: steps are 1..%d", step, dep.horizon)
        return
    for t in range(store.last_closing() + 1, step + 1):
        body = orjson.dumps({"step": t})
        await _send_all(_send("reports", None, body, partition=p, headers=[(CONTROL_HEADER, b"close")])
                        for p in range(P))
        store.mark_closing(t)
        _opened_at[t + 1] = time.monotonic()
        log.info("close markers for step %d written to %d partitions", t, P)


_opened_at: dict[int, float] = {1: time.monotonic()}
_coverage: dict[int, dict[int, int]] = {}


def _on_progress(value: bytes) -> None:
    msg = loads_state(value)
    _coverage.setdefault(int(msg["step"]), {})[int(msg["partition"])] = int(msg["reported"])


async def on_control(value: bytes) -> None:
    try:
        cmd = orjson.loads(value)
        if cmd.get("command") != "close":
            raise ValueError(f"unknown command {cmd.get('command')!r}")
        log.info("close command for step %s", cmd.get("step"))
        await close_through(int(cmd["step"]))
    except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as err:
        log.error("ignoring control message %r: %s", value[:200], err)


async def auto_close() -> None:
    mode = dep.steps.close
    step = store.last_closing() + 1
    if mode == "control" or step > dep.horizon:
        return
    if mode == "coverage" and sum(_coverage.get(step, {}).values()) >= rt.roster.n:
        await close_through(step)
    elif mode == "deadline" and time.monotonic() - _opened_at.setdefault(step, time.monotonic()) >= dep.steps.deadline_seconds:
        await close_through(step)


async def _consume() -> None:
    global _control_done
    async for batch in consumer.batches():
        for tp, messages in batch.items():
            if tp.topic == names["step-partials"]:
                if any([_take_partial(m.offset, m.key, m.value) for m in messages]):
                    await release_ready_steps()
            elif tp.topic == names["control"]:
                for m in messages:
                    await on_control(m.value)
                _control_done = messages[-1].offset + 1


async def _every(seconds: float, fn) -> None:
    """Run ``fn`` every ``seconds``: closing by coverage or deadline, and republishing after a rebalance."""
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
