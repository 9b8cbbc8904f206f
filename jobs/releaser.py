"""Releaser (Faust app, one instance): step partials -> noisy releases -> public topics.

Run through the command line: ``dpstream releaser --config config/sipp-poverty.yaml``.

* ``step-partials``: waits until every reports partition's partial of step t has arrived, runs the
  mechanisms (``ReleaseEngine``), commits the complete release — records, ledger entries, engine
  state — to Redis in one transaction, and only then publishes: manifests to ``releases``, the new
  synthetic columns in chunks to ``synthetic``, alerts to ``alerts``, flags to ``feedback``.
  A step whose record exists is republished from Redis, never recomputed.
* ``control``: ``{"command": "close", "step": t}`` writes a close marker to every partition of
  ``reports`` (for every step up to t not yet closed, in order). With ``steps.close: coverage`` or
  ``deadline`` the releaser also closes steps by itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

import faust
import orjson
from faust.types import TP

from pipeline.plan import budget_plan
from pipeline.privacy.accounting import BudgetExhaustedError
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.engine import ReleaseEngine, ReleaseOutput
from pipeline.stream.faults import crash_point
from pipeline.stream.messages import CONTROL_HEADER, PartialAssembler, synthetic_chunks
from pipeline.stream.metrics import METRICS, serve_metrics, start_lag_monitor
from pipeline.stream.runtime import Runtime
from pipeline.stream.store import StepAlreadyReleased, StepRecord
from pipeline.stream.topics import read_partition

log = logging.getLogger("dpstream.releaser")

rt = Runtime.from_env()
dep = rt.deployment
names = rt.names
P = dep.topics.partitions

app = faust.App(f"dpstream-{dep.name}-releaser", **rt.faust_settings())

raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
partials_topic = app.topic(names["step-partials"], partitions=1, **raw)
control_topic = app.topic(names["control"], partitions=1, **raw)
reports_topic = app.topic(names["reports"], partitions=P, **raw)
feedback_topic = app.topic(names["feedback"], partitions=P, **raw)
releases_topic = app.topic(names["releases"], partitions=1, **raw)
synthetic_topic = app.topic(names["synthetic"], partitions=1, **raw)
alerts_topic = app.topic(names["alerts"], partitions=1, **raw)

store = rt.store()

# The plan is checked before anything runs; a restart must not silently change it.
_plan = {name: dataclasses.asdict(cost) for name, cost in budget_plan(dep).allotments().items()}
_stored_plan = store.save_plan(_plan)
if _stored_plan != json.loads(json.dumps(_plan, sort_keys=True)):
    raise SystemExit(f"the budget plan in Redis differs from this configuration's: stored {_stored_plan}, "
                     f"configured {_plan}; refusing to start (a changed plan would re-spend budget)")

_last, _state_blob = store.latest_state()
engine = ReleaseEngine.from_state(dep, loads_state(_state_blob)) if _state_blob else ReleaseEngine(dep, rt.roster.n)
assembler = PartialAssembler(P)
_stopped_reason: str | None = None
_republished = False
_step_lock = asyncio.Lock()


async def _send_all(sends) -> None:
    futures = [await coro for coro in sends]
    for fut in futures:
        await fut  # acknowledged by the broker


async def publish(step: int, outputs: list[ReleaseOutput]) -> None:
    """Publish a committed step (also used to republish after a restart: same bytes every time)."""
    sends = []
    for out in outputs:
        key = f"{out.release}:{step}".encode()
        sends.append(releases_topic.send(key=key, value=orjson.dumps(out.manifest)))
        if out.columns is not None:
            for ckey, cval in synthetic_chunks(out.release, step, out.column_steps, out.columns):
                sends.append(synthetic_topic.send(key=ckey, value=cval))
        if out.alerts is not None:
            sends.append(alerts_topic.send(key=key, value=orjson.dumps(out.alerts)))
        if out.feedback is not None:
            body = orjson.dumps({"release": out.release, "step": step, **out.feedback})
            for p in range(P):
                sends.append(feedback_topic.send(key=key, value=body, partition=p))
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
    tp = TP(topic, 0)
    try:
        return (await app.consumer.highwaters(tp)).get(tp)
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
            crash_point("releaser.after_commit", step)
            await publish(step, outputs)
            _observe(outputs, started)
            log.info("released step %d", step)


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


_partials_check: int | None = None  # set on assignment: the Redis resume offset to re-read step-partials from


def _read_partials(offset: int) -> tuple[list, int]:
    """step-partials messages from ``offset`` to the current end, read directly (no consumer group)."""
    return read_partition(rt.broker, names["step-partials"], 0, offset)


@app.timer(interval=1.0)
async def _after_rebalance() -> None:
    """After a (re)assignment, outside the rebalance callback: re-read step-partials from the resume
    offset kept in Redis. Faust repositions a newly assigned partition at the group's committed offset
    after the assignment callback (undoing its seek), and that offset may be past partials of a step
    not yet released: they would never be read again and the step never released. Also republishes
    what the public log lacks (see _republish_pending)."""
    global _partials_check, _last_partial_offset
    if _partials_check is not None:
        resume, _partials_check = _partials_check, None
        records, end = await asyncio.to_thread(_read_partials, resume)
        if end < resume:  # a log never shrinks on durable Kafka: a memory-only broker restarted
            log.warning("%s ends at offset %d, before the resume offset %d: the broker lost the log; reading the "
                        "new log from its start", names["step-partials"], end, resume)
            await app.consumer.seek(TP(names["step-partials"], 0), 0)
            _last_partial_offset = -1
            records, end = await asyncio.to_thread(_read_partials, 0)
        if records:
            log.info("re-read %d step-partials message(s) from offset %d", len(records), records[0][0])
        for offset, key, value in records:
            _take_partial(offset, key, value)
        await release_ready_steps()
    if not _republished:
        await release_ready_steps()


@app.task
async def _startup() -> None:
    serve_metrics(rt.metrics_port)
    start_lag_monitor(rt)  # one process exports the lag, so each series exists once
    await release_ready_steps()  # republishes first, under the same lock as releasing


_last_partial_offset = -1


@app.on_partitions_assigned.connect
async def _seek_inputs(sender, assigned, **kwargs) -> None:
    """Re-read inputs from Redis-recorded positions, whatever Faust committed: partials from the
    first one of an unreleased step, control commands from the start (closing is idempotent)."""
    global _republished, _partials_check
    _republished = False  # after a rebalance (e.g. the broker came back), check the public log again
    for tp in assigned:
        if tp.topic == names["step-partials"]:
            _partials_check = store.partials_resume()  # re-read by _after_rebalance (this seek may be undone)
            await app.consumer.seek(tp, _partials_check)
        elif tp.topic == names["control"]:
            await app.consumer.seek(tp, 0)


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
    return True


@app.agent(partials_topic)
async def collect(stream):
    async for event in stream.events():
        if _take_partial(event.message.offset, event.key, event.value):
            await release_ready_steps()


# -- closing steps ----------------------------------------------------------------------------------
def _closing() -> int:
    value = store.r.get(store._k("closing"))
    return int(value) if value is not None else 0


async def close_through(step: int) -> None:
    """Write close markers for every step after the last one closed, up to ``step``, in order."""
    if not 1 <= step <= dep.horizon:
        log.error("refusing to close step %s: steps are 1..%d", step, dep.horizon)
        return
    for t in range(_closing() + 1, step + 1):
        body = orjson.dumps({"step": t})
        await _send_all(
            reports_topic.send(value=body, partition=p, headers=[(CONTROL_HEADER, b"close")]) for p in range(P)
        )
        store.r.set(store._k("closing"), t)
        _opened_at[t + 1] = time.monotonic()
        log.info("close markers for step %d written to %d partitions", t, P)


_opened_at: dict[int, float] = {1: time.monotonic()}
_coverage: dict[int, dict[int, int]] = {}


def _on_progress(value: bytes) -> None:
    msg = loads_state(value)
    _coverage.setdefault(int(msg["step"]), {})[int(msg["partition"])] = int(msg["reported"])


@app.agent(control_topic)
async def control(stream):
    async for event in stream.events():
        try:
            cmd = orjson.loads(event.value)
            if cmd.get("command") != "close":
                raise ValueError(f"unknown command {cmd.get('command')!r}")
            await close_through(int(cmd["step"]))
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as err:
            log.error("ignoring control message %r: %s", event.value[:200], err)


@app.timer(interval=0.5)
async def auto_close() -> None:
    mode = dep.steps.close
    step = _closing() + 1
    if mode == "control" or step > dep.horizon:
        return
    if mode == "coverage" and sum(_coverage.get(step, {}).values()) >= rt.roster.n:
        await close_through(step)
    elif mode == "deadline" and time.monotonic() - _opened_at.setdefault(step, time.monotonic()) >= dep.steps.deadline_seconds:
        await close_through(step)


if __name__ == "__main__":
    app.main()
