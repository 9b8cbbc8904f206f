"""The release protocol of the releaser, without Kafka: assemble the partials of a step, release it,
commit it, publish it; republish after a restart; close steps (docs/streaming.md, "Releasing a step").

:class:`ReleaseCoordinator` is driven by plain calls — a partial arrived (:meth:`take_partial`), a
close command (:meth:`on_control`), time passed (:meth:`tick`), the consumer was (re)assigned
(:meth:`on_assign_partials`) — and reaches the outside only through

* a :class:`pipeline.stream.state.commit_order.CommitOrder` over a publisher (the broker, in the job), which
  owns the order "publish, await the acknowledgements, then write the Redis pointer";
* an :class:`pipeline.stream.state.store_async.AsyncStateStore` (Redis);
* ``log_end(topic)``: where partition 0 of a topic ends (None: cannot tell), and ``log_id(topic)``:
  the broker's topic id (None: it has none), to notice a broker that lost or replaced a log
  (:mod:`pipeline.stream.kafka.log_identity`);

so the job (``jobs/releaser.py``) is the Kafka consumer around it and the tests drive it directly.

The protocol, per step t once every partition's partial of t is in:

1. the mechanisms run (:class:`pipeline.stream.releaser.engine.ReleaseEngine`: noise is drawn here, once);
2. the complete release — records, ledger entries, engine state — is committed to Redis in one
   transaction **before** anything is published; a step someone already committed is taken from
   Redis instead (its noise is the release: never redrawn, never spent twice);
3. the partials' resume offset moves past t (a restart re-reads only unreleased partials), saved with
   the topic id of the log it is an offset in;
4. everything of t is published with t's public close time as timestamp, and once the broker
   acknowledged it all, ``published`` moves to t. A restart republishes the committed steps after
   ``published`` from their records: the same bytes.

Closing: a close command for step t writes close markers for every step not yet closed up to t to
every reports partition, then (acknowledged) moves ``closing`` and records the step's public close
time and marker; with ``steps.close: deadline`` a step also closes ``deadline_seconds`` after the
previous close (:mod:`pipeline.stream.releaser.closing`). With a ``verifier`` (the job always has
one)
a close command counts only when it carries the curator's signature for every step it closes, and
the markers are those signed statements (:mod:`pipeline.stream.control.signatures`); an unverified
command is dead-lettered with its reason and closes nothing. Deadline closes are signed with the
deadline key (``deadline_signer``).

Re-driving a close (:meth:`ReleaseCoordinator.redrive_closes`): steps closed but not released
(``closing`` > ``released``) may have lost their markers or partials (a broker that lost its log
between the close and the release). At start, and whenever the partials log turns out lost, the
releaser writes their markers again: the recorded marker bytes, verbatim (no signing needed). A
partition that had closed the
step re-sends the partial its checkpoint keeps (the same bytes); one that had not closes it now. The
step is then released once (the commit is guarded in Redis); no noise was drawn for it before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson

from pipeline.privacy.errors import BudgetExhaustedError
from pipeline.releases import get_kind
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.control.signatures import (
    CloseCommand,
    CloseSigner,
    CloseVerifier,
    SignedClose,
    Unverified,
)
from pipeline.stream.kafka.messages import (
    CONTROL_HEADER,
    PartialAssembler,
    close_marker,
    dead_letter_headers,
    synthetic_chunks,
)
from pipeline.stream.process.faults import crash_point
from pipeline.stream.process.limits import DEAD_LETTER_COPY_BYTES
from pipeline.stream.process.metrics import METRICS
from pipeline.stream.releaser.closing import DeadlineClock, now_ms
from pipeline.stream.releaser.engine import (
    ReleaseEngine,
    ReleaseOutput,
    needs_records,
    restore_records,
    stored_state,
)
from pipeline.stream.releaser.fence import check_fence
from pipeline.stream.state.commit_order import CommitOrder
from pipeline.stream.state.store import StepAlreadyReleased, StepRecord

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.stream.state.store_async import AsyncStateStore

__all__ = ["ReleaseCoordinator"]

log = logging.getLogger("dpstream.releaser")


def _canonical(obj) -> bytes:
    """JSON with sorted keys: a republished record has the same bytes as the first copy, whether its
    value comes from the mechanism or back from the Redis record (whose maps are stored sorted)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


class ReleaseCoordinator:
    """One releaser's protocol state; build it with :meth:`create` (it reads Redis)."""

    def __init__(
        self,
        deployment: Deployment,
        engine: ReleaseEngine,
        store: AsyncStateStore,
        commit_order: CommitOrder,
        names: dict[str, str],
        log_end: Callable[[str], Awaitable[int | None]],
        clock: Callable[[], int] = now_ms,
        verifier: CloseVerifier | None = None,
        deadline_signer: CloseSigner | None = None,
        log_id: Callable[[str], Awaitable[str | None]] | None = None,
    ):
        """``verifier``: close commands must carry the curator's signatures (None: unsigned
        commands and markers, for tests driving the protocol without keys; the job always passes
        one). ``log_id``: the broker's id of a topic (pipeline.stream.kafka.log_identity), how a
        lost or replaced step-partials log is found."""
        self.deployment = deployment
        self.verifier = verifier
        self.deadline_signer = deadline_signer
        self.engine = engine
        self.store = store
        self.commit_order = commit_order
        self.names = names
        self.log_end = log_end
        self.log_id = log_id or _no_log_id
        self.partials_log: str | None = None  # topic id of the step-partials log being read
        self.clock = clock  # ms; the deadline clock and the publish hold read it
        self.partitions = deployment.topics.partitions
        self.assembler = PartialAssembler(self.partitions)
        self.stopped_reason: str | None = (
            None  # set when the budget is exhausted: nothing more is released
        )
        self.last_partial_offset = -1  # highest step-partials offset taken
        self._republished = (
            False  # the public log was checked (and filled in) since the last assignment
        )
        self._redrive = (
            True  # closes not released yet are re-driven at start and after a lost partials log
        )
        self._lock = asyncio.Lock()  # one release (or republication) at a time
        # The first step's deadline counts from the releaser's start (a public event), later ones from
        # the previous close; no report is ever looked at.
        self._deadline = DeadlineClock(
            deployment.steps.deadline_seconds if deployment.steps.close == "deadline" else None,
            clock(),
        )

    @classmethod
    async def create(
        cls,
        deployment: Deployment,
        n: int,
        instance: str,
        store: AsyncStateStore,
        commit_order: CommitOrder,
        names: dict[str, str],
        log_end: Callable[[str], Awaitable[int | None]],
        clock: Callable[[], int] = now_ms,
        verifier: CloseVerifier | None = None,
        deadline_signer: CloseSigner | None = None,
        log_id: Callable[[str], Awaitable[str | None]] | None = None,
    ):
        """The engine restored from the last committed step (a fresh one before the first), stamping
        ``instance`` (the deployment's public instance id, read back by the fence) into every manifest."""
        last, blob = await store.latest_state()
        engine = (
            await _engine_from(deployment, store, last, blob)
            if blob
            else ReleaseEngine(deployment, n)
        )
        engine.instance = instance
        return cls(
            deployment,
            engine,
            store,
            commit_order,
            names,
            log_end,
            clock,
            verifier,
            deadline_signer,
            log_id,
        )

    # -- events ------------------------------------------------------------------------------------
    async def on_assign_partials(self) -> int:
        """The consumer got ``step-partials`` (again): the offset to read it from (the Redis resume
        offset, whatever the group committed), and the public log is checked again before releasing.

        The resume offset is an offset in one log: if the topic id recorded with it is not the log's
        id now, the broker lost or replaced the log, and the new one is read from its start however
        far it has grown (workers may have re-sent partials to it before this assignment). Without
        topic ids, a log that ends before the resume offset is the only evidence."""
        self._republished = (
            False  # after a rebalance (e.g. the broker came back), check the public log again
        )
        topic = self.names["step-partials"]
        resume, recorded = await self.store.partials_resume(), await self.store.partials_log()
        current = await self.log_id(topic)
        end = await self.log_end(topic)
        replaced = recorded is not None and current is not None and recorded != current
        if replaced or (end is not None and end < resume):  # a log never shrinks on durable Kafka
            why = (
                f"its topic id is {current}, the resume offset {resume} was in log {recorded}"
                if replaced
                else f"it ends at offset {end}, before the resume offset {resume}"
            )
            log.warning(
                "%s: %s: the broker lost or replaced the log (memory-only broker restarted?); reading the "
                "new log from its start",
                topic,
                why,
            )
            resume, self.last_partial_offset = 0, -1
            self.assembler = PartialAssembler(self.partitions)  # its offsets are in the old log
            self._redrive = True
            await self.store.set_partials_resume(
                0, current
            )  # a crash from here on reads the new log from 0
        elif (
            current is not None and recorded != current
        ):  # first start (or a state from before topic ids)
            await self.store.set_partials_log(
                current
            )  # not the offset: a release meanwhile may have moved it
        self.partials_log = current
        log.info("%s is log %s", topic, current or "without a topic id")
        log.info("reading %s from offset %d", topic, resume)
        return resume

    def take_partial(self, offset: int, key: bytes | None, value: bytes) -> bool:
        """One step-partials message (duplicates are harmless); True when it may complete a step."""
        self.last_partial_offset = max(self.last_partial_offset, offset)
        if (key or b"").startswith(b"progress:"):
            return False  # coverage progress of an earlier version (closing by coverage is refused now)
        step = self.assembler.add(value, offset)
        if step <= self.engine.step:
            self.assembler.discard_before(
                self.engine.step + 1
            )  # a replayed partial of a released step
            return False
        if self.assembler.complete(step):
            log.info("partials of step %d complete", step)
        return True

    async def on_control(self, value: bytes, timestamp_ms: int, offset: int = -1) -> None:
        """A close command. Signed (with a verifier): its signed ``closed_at`` is the public close
        time, and a
        command without a valid signature for every step it would close is dead-lettered. Unsigned
        (no
        verifier): its record timestamp (set by the operator's client) is."""
        if self.verifier is not None:
            await self._on_signed_control(value, offset)
            return
        try:
            cmd = orjson.loads(value)
            if cmd.get("command") != "close":
                raise ValueError(f"unknown command {cmd.get('command')!r}")
            log.info("close command for step %s", cmd.get("step"))
            await self.close_through(
                int(cmd["step"]), timestamp_ms if timestamp_ms >= 0 else self.clock()
            )
        except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as err:
            log.error("ignoring control message %r: %s", value[:200], err)

    async def _on_signed_control(self, value: bytes, offset: int) -> None:
        try:
            cmd = CloseCommand.parse(value)
            first = await self.store.last_closing() + 1
            if cmd.step < first:
                return  # closes nothing (the control log is re-read from its start at every start)
            verifier = self.verifier
            assert verifier is not None  # on_control calls this only with a verifier
            signed = cmd.verified(verifier, first)
        except Unverified as err:
            log.error(
                "dead-lettering control message at offset %d (%s): %s", offset, err.reason, err
            )
            await self._dead_letter(value, err, offset)
            return
        log.info("close command for step %d (signed by the curator)", cmd.step)
        await self.close_through(cmd.step, cmd.closed_at, signed)

    async def _dead_letter(self, value: bytes, err: Unverified, offset: int) -> None:
        """An unverified control message to ``dead-letter`` (key ``control:0:<offset>``: stable
        when the
        control log is re-read), its reason and detail in the headers, as the workers write
        theirs."""
        headers = dead_letter_headers(err.reason, str(err), self.names["control"], 0, offset, None)
        batch = self.commit_order.begin()
        await batch.send(
            self.names["dead-letter"],
            bytes(value or b"")[:DEAD_LETTER_COPY_BYTES],
            key=f"control:0:{offset}".encode(),
            headers=headers,
        )
        await batch.acknowledged()
        METRICS.dead_letters.labels(err.reason).inc()

    async def tick(self) -> None:
        """Time passed: close the open step if its deadline is due; republish after a reassignment."""
        step = await self.store.last_closing() + 1
        due = self._deadline.due(self.clock())
        if due is not None and step <= self.deployment.horizon:
            await self.close_through(step, due)
        if not self._republished:
            await self.release_ready_steps()
        if self._redrive:
            await self.redrive_closes()

    async def check_fence(self, stamps) -> int:
        """Before the first release: refuse (StateLost) when the ``releases`` topic, read as ``stamps``,
        holds releases this state does not know (see :mod:`pipeline.stream.releaser.fence`); the last released step."""
        released = await self.store.last_released()
        check_fence(stamps, self.engine.instance, released, self.names["releases"])
        return released

    # -- releasing ---------------------------------------------------------------------------------
    async def release_ready_steps(self) -> None:
        """Republish what a crash left unpublished, then release every step whose partials are complete."""
        async with self._lock:
            await self._republish_pending()
            while self.stopped_reason is None and self.assembler.complete(self.engine.step + 1):
                await self._release(self.engine.step + 1)

    async def _release(self, step: int) -> None:
        started = time.perf_counter()
        partials = self.assembler.pop(step)
        try:
            outputs = self.engine.release(step, partials)
        except BudgetExhaustedError as err:
            self.stopped_reason = str(err)
            METRICS.budget_refusals.labels(err.release).inc()
            log.error("budget exhausted, releases stopped: %s", err)
            return
        ledger = {
            f"{e.release}:{e.step}": e.get_state()
            for e in self.engine.ledger.entries
            if e.step == step
        }
        record = StepRecord(
            step,
            {o.release: o.to_bytes() for o in outputs},
            dumps_state(stored_state(self.engine.get_state())),
        )
        computed = time.perf_counter()
        crash_point("releaser.before_commit", step)
        try:
            await self.store.commit_step(record, ledger)
        except StepAlreadyReleased:
            # Someone (an earlier incarnation) committed it: the stored record is the release.
            record = await _committed_step(self.store, step)
            if record.state is None:  # the last committed step always carries the releaser's state
                raise RuntimeError(f"step {step}'s stored record has no releaser state") from None
            self.engine = await _engine_from(self.deployment, self.store, step, record.state)
            outputs = self._outputs(record)
            METRICS.republished.inc()
        resume = self.assembler.min_offset()
        await self.store.set_partials_resume(
            resume if resume is not None else self.last_partial_offset + 1, self.partials_log
        )
        committed = time.perf_counter()
        crash_point("releaser.after_commit", step)
        await self._hold_until_public_time(step, outputs)
        await self.publish(step, outputs)
        self._observe(step, outputs, started)
        log.info(
            "released step %d (mechanisms %.3f s, Redis commit %.3f s, publish %.3f s)",
            step,
            computed - started,
            committed - computed,
            time.perf_counter() - committed,
        )

    def _outputs(self, record: StepRecord) -> list[ReleaseOutput]:
        return [
            ReleaseOutput.from_bytes(
                record.releases[rel.name], f"{self.store.keys.step(record.step)} {rel.name}"
            )
            for rel in self.deployment.releases
        ]

    async def publish(self, step: int, outputs: list[ReleaseOutput]) -> None:
        """Publish a committed step (also to republish it after a restart: the same bytes every time);
        ``published`` moves to ``step`` once the broker acknowledged every message of it."""
        ts = _public_timestamp(step, outputs)
        messages = []  # (logical topic, key, value, partition, timestamp)
        for out in outputs:
            key = f"{out.release}:{step}".encode()
            messages.append(("releases", key, _canonical(out.manifest), 0, ts))
            if out.columns is not None:
                messages += [
                    ("synthetic", ckey, cval, 0, ts)
                    for ckey, cval in synthetic_chunks(
                        out.release, step, out.column_steps, out.columns
                    )
                ]
            if out.alerts is not None:
                messages.append(("alerts", key, _canonical(out.alerts), 0, ts))
            if out.feedback is not None:
                body = _canonical({"release": out.release, "step": step, **out.feedback})
                messages += [("feedback", key, body, p, None) for p in range(self.partitions)]
        batch, half = self.commit_order.begin(), len(messages) // 2
        for i, (topic, key, value, partition, timestamp) in enumerate(messages):
            if i == half:
                await batch.acknowledged()
                crash_point("releaser.mid_publish", step)
            await batch.send(
                self.names[topic], value, key=key, partition=partition, timestamp_ms=timestamp
            )
        await batch.commit(lambda: self.store.mark_published(step))
        METRICS.released_step.set(step)

    async def _republish_pending(self) -> None:
        """Republish steps committed but not (known to be) fully published before a crash: same bytes.

        If the broker lost the public log (a memory-only broker restarted: ``releases`` is empty although
        steps were published; durable Kafka never shrinks a log), every committed step is republished."""
        if self._republished:
            return
        first = await self.store.last_published() + 1
        if first > 1 and await self.log_end(self.names["releases"]) == 0:
            log.warning(
                "the broker lost the public topics (%s is empty, %d step(s) were published): republishing "
                "every committed step from Redis",
                self.names["releases"],
                first - 1,
            )
            first = 1
        for step in range(first, await self.store.last_released() + 1):
            record = await _committed_step(self.store, step)
            await self.publish(step, self._outputs(record))
            METRICS.republished.inc()
            log.info("republished step %d from its stored record", step)
        self._republished = True

    async def _hold_until_public_time(self, step: int, outputs: list[ReleaseOutput]) -> None:
        """With ``steps.publish_delay_seconds`` = L, publish step t at its public close time + L, so when
        its records appear does not depend on how long the release took (docs/privacy.md, "Closing
        rules and timing"). A release not ready by then is published at once and counted as an overrun
        (that it was late is then visible: choose L above the worst case)."""
        hold = self.deployment.steps.publish_delay_seconds
        closed_at = _closed_at(outputs)
        if not hold or closed_at is None:
            return
        wait = closed_at + hold - self.clock() / 1000
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            METRICS.publish_overruns.inc()
            log.warning(
                "step %d was ready %.3f s after close + publish_delay_seconds: published late",
                step,
                -wait,
            )

    def _observe(self, step: int, outputs: list[ReleaseOutput], started: float) -> None:
        METRICS.release_seconds.observe(time.perf_counter() - started)
        closed_at = _closed_at(outputs)
        if (
            closed_at is not None
        ):  # curator-side only: the public records carry the close time itself
            METRICS.close_to_publish_seconds.set(self.clock() / 1000 - closed_at)
            METRICS.close_to_publish_step.set(step)
        for out in outputs:
            priv = out.manifest.get("privacy", {}).get("release_spent") or {}
            if "rho" in priv:
                METRICS.privacy_rho.labels(out.release).set(priv["rho"])
            if "epsilon" in priv:
                METRICS.privacy_epsilon.labels(out.release).set(priv["epsilon"])
            # the kind says which of its public numbers are worth a metric (pipeline.releases: ``observe``):
            # a counter is increased by the value, a gauge set to it
            for name, value in (
                get_kind(out.manifest["type"]).observe(out.manifest, out.alerts).items()
            ):
                metric = getattr(METRICS, name).labels(out.release)
                metric.set(value) if hasattr(metric, "set") else metric.inc(value)

    # -- closing steps -----------------------------------------------------------------------------
    async def close_through(
        self, step: int, closed_at: int, signed: dict[int, SignedClose] | None = None
    ) -> None:
        """Write close markers for every step after the last one closed, up to ``step``, in order, each
        carrying the public close time ``closed_at`` (ms); ``closing`` moves once they are
        acknowledged.
        ``signed``: the curator's verified closes (a close command); without, a deadline close,
        signed
        with the deadline key (unsigned only when the coordinator has no verifier)."""
        if not 1 <= step <= self.deployment.horizon:
            log.error("refusing to close step %s: steps are 1..%d", step, self.deployment.horizon)
            return
        if (
            self._redrive
        ):  # the markers of earlier unreleased closes go first: workers close steps in order
            await self.redrive_closes()
        first = await self.store.last_closing() + 1
        for t in range(first, step + 1):
            marker = self._marker(t, closed_at, signed)
            if marker is None:
                log.error(
                    "no signed close marker for step %d: not closing it (a close command "
                    "signs every step from the first not released; a deadline close needs "
                    "the deadline key)",
                    t,
                )
                return
            batch = await self._send_markers(t, marker)
            await batch.commit(lambda: self.store.mark_closing(t, closed_at, marker))  # noqa: B023  (awaited here)
            log.info("close markers for step %d written to %d partitions", t, self.partitions)
        if first <= step:
            self._deadline.closed(closed_at)

    async def redrive_closes(self) -> list[int]:
        """Write the close markers of every step closed but not released again (see the module docstring);
        the steps re-driven. Harmless when nothing was lost: workers take a repeated marker as a
        request to re-send the partial they keep, and the releaser ignores partials it already has."""
        self._redrive = False
        released, closing = await self.store.last_released(), await self.store.last_closing()
        steps = list(range(released + 1, closing + 1))
        if not steps:
            return []
        log.warning(
            "steps %d..%d are closed but not released: writing their close markers again, so partitions "
            "whose partial or marker was lost (a broker that lost its log) re-send or close them",
            steps[0],
            steps[-1],
        )
        for t in steps:
            marker = await self.store.close_marker(t)
            if marker is None and self.verifier is not None:
                log.error(
                    "step %d has no kept close marker (closed by a dpstream that kept none): "
                    "its close cannot be re-driven without the curator; if it stays "
                    "unreleased, see docs/streaming.md, 'A lost close'",
                    t,
                )
                continue
            if marker is None:  # unsigned (no verifier): rebuilt from the recorded close time
                closed_at = await self.store.close_time(t)
                if closed_at is None:  # a close recorded before close times were kept
                    closed_at = self.clock()
                    log.warning(
                        "step %d has no recorded close time: its re-driven markers carry now (%d)",
                        t,
                        closed_at,
                    )
                marker = close_marker(t, closed_at)
            await (await self._send_markers(t, marker)).acknowledged()
        log.info(
            "close markers of step(s) %s written again to %d partitions", steps, self.partitions
        )
        return steps

    def _marker(
        self, step: int, closed_at: int, signed: dict[int, SignedClose] | None
    ) -> bytes | None:
        """The marker value of a new close of ``step`` (None: this coordinator cannot make a valid
        one)."""
        if signed is not None:
            return signed[step].marker() if step in signed else None
        if self.deadline_signer is not None:
            return self.deadline_signer.sign(step, closed_at).marker()
        return close_marker(step, closed_at) if self.verifier is None else None

    async def _send_markers(self, step: int, body: bytes):
        """Send the close marker ``body`` of ``step`` to every reports partition; the batch (not yet
        acknowledged)."""
        batch = self.commit_order.begin()
        for p in range(self.partitions):
            await batch.send(
                self.names["reports"], body, partition=p, headers=[(CONTROL_HEADER, b"close")]
            )
        return batch


async def _committed_step(store: AsyncStateStore, step: int) -> StepRecord:
    """The stored record of a committed step (committed records are never deleted)."""
    record = await store.load_step(step)
    if record is None:
        raise RuntimeError(
            f"{store.keys.step(step)} is missing from Redis, yet step {step} was committed"
        )
    return record


async def _engine_from(
    deployment: Deployment, store: AsyncStateStore, step: int, blob: bytes
) -> ReleaseEngine:
    """The engine as step ``step``'s record stored it, its synthesizers' released records read back
    from the records of steps 1..``step`` (:func:`pipeline.stream.releaser.engine.stored_state`)."""
    state = loads_state(blob, f"{store.keys.step(step)} __state__")
    names = needs_records(state)
    if names:
        outputs = {}
        for t in range(1, step + 1):
            record = await _committed_step(store, t)
            outputs[t] = {
                name: ReleaseOutput.from_bytes(
                    record.releases[name], f"{store.keys.step(t)} {name}"
                )
                for name in names
            }
        restore_records(state, outputs)
    return ReleaseEngine.from_state(deployment, state)


async def _no_log_id(topic: str) -> None:
    return None  # no topic ids: the offsets are the only evidence of a lost log


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
