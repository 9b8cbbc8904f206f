"""The bulk consumer against the embedded broker: positions come from the caller (checkpoints), never
from committed offsets, and two members split reports and feedback co-partitioned."""

from __future__ import annotations

import asyncio

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from pipeline.stream.kafka.bulk_consumer import BulkConsumer
from pipeline.stream.local.embedded import EmbeddedServices

P = 4


@pytest.fixture(scope="module")
def broker():
    with EmbeddedServices() as svc:
        admin = KafkaAdminClient(bootstrap_servers=svc.broker.bootstrap)
        admin.create_topics([NewTopic("rep", P, 1), NewTopic("fb", P, 1)])
        admin.close()
        prod = KafkaProducer(bootstrap_servers=svc.broker.bootstrap)
        for p in range(P):
            for i in range(10):
                prod.send("rep", value=f"{p}:{i}".encode(), partition=p)
            prod.send("fb", value=f"fb{p}".encode(), partition=p)
        prod.flush()
        prod.close()
        yield svc.broker.bootstrap


async def _collect(consumer: BulkConsumer, want: int, timeout: float = 30.0) -> list:
    got = []

    async def run():
        async for batch in consumer.batches():
            for tp, msgs in batch.items():
                got.extend((tp.topic, tp.partition, m.offset) for m in msgs)
            if len(got) >= want:
                return

    await asyncio.wait_for(run(), timeout)
    return got


def test_positions_come_from_the_assignment_callback(broker):
    async def main():
        resume = {"rep": 7, "fb": 0}  # e.g. a checkpoint at offset 6 of every reports partition
        assigned = []

        async def on_assign(tps):
            assigned.extend(tps)
            return {tp: resume[tp.topic] for tp in tps}

        async def on_revoke(tps):
            pass

        c = BulkConsumer(broker, "bulk-test-1", ["rep", "fb"], on_assign, on_revoke)
        await c.start()
        try:
            got = await _collect(c, want=P * 3 + P)
        finally:
            await c.stop()
        return assigned, got

    assigned, got = asyncio.run(main())
    assert {(tp.topic, tp.partition) for tp in assigned} == {(t, p) for t in ("rep", "fb") for p in range(P)}
    rep = sorted(x for x in got if x[0] == "rep")
    assert rep == [("rep", p, o) for p in range(P) for o in (7, 8, 9)]  # nothing before the resume offsets
    assert sorted(x for x in got if x[0] == "fb") == [("fb", p, 0) for p in range(P)]


def test_two_members_split_partitions_with_reports_and_feedback_together(broker):
    async def main():
        owned = {0: set(), 1: set()}

        def make(i):
            async def on_assign(tps):
                owned[i] = {(tp.topic, tp.partition) for tp in tps}
                return {tp: 0 for tp in tps}

            async def on_revoke(tps):
                owned[i] -= {(tp.topic, tp.partition) for tp in tps}

            return BulkConsumer(broker, "bulk-test-2", ["rep", "fb"], on_assign, on_revoke)

        a, b = make(0), make(1)
        await a.start()
        await b.start()
        try:
            for _ in range(200):  # until the group has settled with both members
                await asyncio.gather(a.consumer.getmany(timeout_ms=50), b.consumer.getmany(timeout_ms=50))
                if owned[0] and owned[1] and len(owned[0] | owned[1]) == 2 * P:
                    break
        finally:
            await a.stop()
            await b.stop()
        return owned

    owned = asyncio.run(main())
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    for member in owned.values():  # the member owning reports partition p owns feedback partition p
        assert {p for t, p in member if t == "rep"} == {p for t, p in member if t == "fb"}


def test_committed_offsets_past_the_checkpoint_are_ignored(broker):
    """The group committed offset 10 (everything) but the checkpoint says resume at 4: the records
    4..9 come again. A client that moved a new assignment to the committed offset after the callback's
    seek would lose reports a killed worker had consumed but not checkpointed; this one must not."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    group = "bulk-test-3"
    committer = KafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
    committer.commit({TopicPartition("rep", p): OffsetAndMetadata(10, "", -1) for p in range(P)})
    committer.close()

    async def main():
        async def on_assign(tps):
            return {tp: (4 if tp.topic == "rep" else 0) for tp in tps}

        async def on_revoke(tps):
            pass

        c = BulkConsumer(broker, group, ["rep", "fb"], on_assign, on_revoke)
        await c.start()
        try:
            return await _collect(c, want=P * 6 + P)
        finally:
            await c.stop()

    got = asyncio.run(main())
    assert sorted(x for x in got if x[0] == "rep") == [("rep", p, o) for p in range(P) for o in range(4, 10)]


def test_a_failing_assignment_callback_ends_the_consumption_with_its_error(broker):
    """aiokafka only logs a rebalance listener's exception; a checkpoint the worker cannot read must
    stop the job instead (pipeline.serialization.StateFormatError names the key), not leave it
    consuming partitions it has no state for."""
    from pipeline.serialization import StateFormatError

    async def main():
        async def on_assign(tps):
            raise StateFormatError("dpstream:bulk:checkpoint:0: state format version '1'")

        async def on_revoke(tps):
            pass

        c = BulkConsumer(broker, "bulk-test-failing", ["rep", "fb"], on_assign, on_revoke)
        await c.start()
        try:
            with pytest.raises(StateFormatError, match="checkpoint:0"):
                await _collect(c, want=1)
        finally:
            await c.stop()

    asyncio.run(main())


def test_a_stopped_member_of_the_first_generation_leaves_the_group_at_once(broker):
    """The embedded broker numbers a group's first generation 0, from which aiokafka never sent its
    LeaveGroup: a stopped worker stayed a member until its session timed out (10 s), and the next
    member's join waited for that (~18 s for a worker restarted by `dpstream up` instead of ~5 s)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def members(admin, group: str) -> list:
        (response,) = await admin.describe_consumer_groups([group])
        (described,) = response.groups
        return described[-1]  # (error_code, group, state, protocol_type, protocol, members)

    async def main():
        joined = asyncio.Event()

        async def on_assign(tps):
            joined.set()
            return {tp: 0 for tp in tps}

        async def on_revoke(tps):
            pass

        admin = AIOKafkaAdminClient(bootstrap_servers=broker)
        await admin.start()
        c = BulkConsumer(broker, "bulk-test-leave", ["rep", "fb"], on_assign, on_revoke)
        await c.start()
        try:
            consuming = asyncio.ensure_future(_collect(c, want=10 ** 9, timeout=60))
            await asyncio.wait_for(joined.wait(), 30)
            before = await members(admin, "bulk-test-leave")
            consuming.cancel()
        finally:
            await c.stop()
        after = await members(admin, "bulk-test-leave")
        await admin.close()
        return before, after

    before, after = asyncio.run(main())
    assert len(before) == 1  # the only member, of the group's first generation
    assert after == []
