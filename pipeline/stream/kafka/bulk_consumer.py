"""Bulk consumption for the jobs: aiokafka ``getmany`` in a consumer group, no per-event path.

Both jobs read their inputs with a plain aiokafka consumer and hand whole fetches to vectorised
logic (the worker) or to the release protocol (the releaser).

Positions come from the Redis checkpoints, never from Kafka's committed offsets: on every assignment
the caller's ``on_assign`` returns the offset to resume each partition from (the checkpoint's
marker + 1, or 0). The offsets :meth:`commit_loop` commits feed the consumer-lag gauge only and
are never read back. The range assignor gives partition p of
``reports`` and of ``feedback`` (same partition count) to the same member, which the feedback loop
relies on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaError
from aiokafka.protocol.group import LeaveGroupRequest

from pipeline.connections import kafka_security
from pipeline.stream.kafka import group_session
from pipeline.stream.kafka.log_identity import BrokerUnreachable, broker_wait_seconds
from pipeline.stream.process.limits import MAX_MESSAGE_BYTES

__all__ = ["BulkConsumer", "INGEST_FETCH_MAX_WAIT_MS", "RELEASER_FETCH_MAX_WAIT_MS"]

# How long the broker may take over one fetch. The embedded durable broker (Tansu) spends it listing
# the partition's stored batches and reading them, and gives up when it runs out: a fetch whose wait
# is shorter than the listing returns nothing, however long the client tries (docs/streaming.md, "The
# durable log"). The workers read `reports`, whose partitions hold as many batches as the producers
# send; 250 ms covers a listing of ~10^4 batches on a loaded machine with room left to read them. On
# an idle partition a longer wait costs latency on Tansu (it polls at half the remaining wait) and
# nothing on Kafka (which answers as soon as data arrives). The releaser's topics hold a few batches
# per step: it keeps the short wait, so a step's partials reach it quickly.
INGEST_FETCH_MAX_WAIT_MS = 250
RELEASER_FETCH_MAX_WAIT_MS = 50

log = logging.getLogger("dpstream.bulk")

OnAssign = Callable[[set[TopicPartition]], Awaitable[dict[TopicPartition, int]]]
OnRevoke = Callable[[set[TopicPartition]], Awaitable[None]]
Handled = Callable[[], dict[TopicPartition, int]]


class _Listener(ConsumerRebalanceListener):
    def __init__(self, owner: BulkConsumer):
        self.owner = owner

    async def on_partitions_revoked(self, revoked):
        if revoked:
            await self.owner._on_revoke(set(revoked))

    async def on_partitions_assigned(self, assigned):
        try:
            positions = await self.owner._on_assign(set(assigned))
        except Exception as err:
            # aiokafka only logs a listener's exception; the job must stop on it instead (e.g. a
            # checkpoint it cannot read), so batches() raises it.
            self.owner.failure = err
            raise
        for tp, offset in positions.items():
            self.owner.consumer.seek(tp, offset)


def _leave_also_from_generation_zero(consumer: AIOKafkaConsumer) -> None:
    """Make ``consumer.stop()`` leave the group also as a member of generation 0.

    aiokafka leaves only from generation 1 on (Kafka's first generation), but the embedded broker
    (Tansu) numbers its first generation 0: a member of it stayed in the group after stopping until
    its session timed out, and the next member's join waited for that (a worker restarted after a
    clean stop got its partitions after ~18 s instead of ~5 s)."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "_maybe_leave_group"):
        return  # another aiokafka: its own leave on stop
    aiokafka_leave = coordinator._maybe_leave_group

    async def leave() -> None:
        if coordinator.generation != 0 or coordinator._group_instance_id is not None:
            return await aiokafka_leave()
        try:  # as aiokafka's: one attempt, never resent
            await coordinator._send_req(
                LeaveGroupRequest(coordinator.group_id, coordinator.member_id)
            )
        except KafkaError as err:
            log.warning("LeaveGroup request failed: %s", err)
        coordinator.reset_generation()

    coordinator._maybe_leave_group = leave


class BulkConsumer:
    """Consume ``topics`` in group ``group_id``; ``batches()`` yields ``{TopicPartition: [messages]}``."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        topics: list[str],
        on_assign: OnAssign,
        on_revoke: OnRevoke,
        max_records: int = 50_000,
        session_timeout_ms: int | None = None,  # default: group_session.session_timeout_ms()
        rebalance_timeout_ms: int = 4_000,
        fetch_max_wait_ms: int = RELEASER_FETCH_MAX_WAIT_MS,
    ):
        self.topics = list(topics)
        self.group_id = group_id
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self.max_records = int(max_records)
        self.failure: Exception | None = None  # raised by the assignment callback: ends batches()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            **kafka_security(),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=64 << 20,
            fetch_max_wait_ms=fetch_max_wait_ms,
            session_timeout_ms=session_timeout_ms or group_session.session_timeout_ms(),
            rebalance_timeout_ms=rebalance_timeout_ms,
            heartbeat_interval_ms=group_session.HEARTBEAT_INTERVAL_MS,
            max_poll_interval_ms=300_000,
        )

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(self.topics, listener=_Listener(self))
        _leave_also_from_generation_zero(self.consumer)

    async def stop(self) -> None:
        await self.consumer.stop()

    async def batches(self, timeout_ms: int = 100):
        while True:
            batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
            if self.failure is not None:
                raise self.failure
            if batch:
                yield batch
            else:
                await asyncio.sleep(0)

    async def commit_loop(self, handled: Handled, interval: float = 2.0) -> None:
        """Every ``interval`` seconds, commit ``handled()`` (partition -> next offset to handle) when it
        moved. For the consumer-lag gauge only: positions are never read back from these commits."""
        committed: dict[TopicPartition, int] = {}
        while True:
            await asyncio.sleep(interval)
            offsets = {
                tp: o
                for tp, o in handled().items()
                if o > 0 and committed.get(tp) != o and tp in self.consumer.assignment()
            }
            if not offsets:
                continue
            try:
                await self.consumer.commit(offsets)
                committed.update(offsets)
            except Exception as err:  # noqa: BLE001 - e.g. a rebalance in progress; the next round commits
                log.debug("position commit skipped: %s", err)

    async def broker_watchdog(self, bound: float | None = None, interval: float = 5.0) -> None:
        """Ask the broker for its metadata every ``interval`` seconds; raise BrokerUnreachable once it has
        not answered for ``bound`` seconds, which ends the job (its supervisor restarts it) rather than
        leaving it retrying against a broker that is gone (docs/streaming.md, "Supervision")."""
        bound = broker_wait_seconds() if bound is None else bound
        interval = min(interval, bound / 2)
        answered = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.wait_for(self.consumer.topics(), timeout=max(interval, 1.0))
                answered = time.monotonic()
            except Exception as err:  # noqa: BLE001 - any failure to answer counts against the bound
                silent = time.monotonic() - answered
                if silent > bound:
                    raise BrokerUnreachable(
                        f"the broker has not answered for {silent:.0f} s (bound {bound:g} s): "
                        f"{err!r}"
                    ) from err
                log.warning("the broker did not answer (%r); %.0f s of %g s", err, silent, bound)
