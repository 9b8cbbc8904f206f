"""A worker's dead letters go to the broker a producer batch at a time
(``pipeline.stream.state.commit_order.Batch.send_many``), not a send each: a file sent twice made
one dead letter per report, and 10^6 of them took the worker ~70 s. What is on the log must be
what one send per message puts there: every message, in order, with its key, value and headers,
acknowledged before the batch's commit runs. Checked on the embedded broker with the workers' own
producer (``pipeline.stream.kafka.job_producer.make_producer``)."""

from __future__ import annotations

import asyncio

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from pipeline.stream.kafka.job_producer import make_producer
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.state.commit_order import CommitOrder


@pytest.fixture(scope="module")
def broker():
    with EmbeddedServices() as svc:
        yield svc.broker.bootstrap


def _letters(count: int, tag: str) -> list[tuple[bytes | None, bytes, list | None]]:
    """Messages of a few hundred bytes, some without a key or headers, one of ~0.6 MB and one
    larger than a producer batch (1 MB: sent alone)."""
    out: list[tuple[bytes | None, bytes, list | None]] = []
    for i in range(count):
        key = None if i % 97 == 0 else f"{tag}:{i}".encode()
        value = (b'{"user":"u%d","step":1}' % i) * (1 + i % 7)
        headers = None if i % 89 == 0 else [("dpstream-reason", b"duplicate"), ("n", b"%d" % i)]
        out.append((key, value, headers))
    out.insert(count // 2, (f"{tag}:big".encode(), b"x" * 600_000, [("n", b"big")]))
    out.insert(count // 3, (f"{tag}:bigger".encode(), b"y" * 1_500_000, None))
    return out


def _read(bootstrap: str, topic: str) -> list[tuple]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    consumer.assign([TopicPartition(topic, 0)])
    got = [(m.key, m.value, [(k, v) for k, v in m.headers] or None) for m in consumer]
    consumer.close()
    return got


async def _send(bootstrap: str, topic: str, records, many: bool) -> list[str]:
    producer = make_producer(bootstrap, linger_ms=5)
    await producer.start()
    done: list[str] = []
    try:
        batch = CommitOrder(producer).begin()
        if many:
            await batch.send_many(topic, records)
        else:
            for key, value, headers in records:
                await batch.send(topic, value, key=key, headers=headers)

        async def written() -> None:  # the commit's write: after every acknowledgement
            done.append("committed")

        await batch.commit(written)
    finally:
        await producer.stop()
    return done


def test_messages_sent_a_batch_at_a_time_are_on_the_log_as_sent_one_by_one(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker)
    admin.create_topics([NewTopic("letters-one", 1, 1), NewTopic("letters-many", 1, 1)])
    admin.close()
    one = _letters(5_000, "t")
    assert asyncio.run(_send(broker, "letters-one", one, many=False)) == ["committed"]
    assert asyncio.run(_send(broker, "letters-many", one, many=True)) == ["committed"]
    by_one, by_batch = _read(broker, "letters-one"), _read(broker, "letters-many")
    assert len(by_batch) == len(one) and by_batch == by_one
    assert by_batch == [(k, v, h) for k, v, h in one]


def test_a_publisher_without_batches_sends_each_message():
    """An in-memory publisher (as the coordinator's unit tests use) has no ``create_batch``: each
    message is sent on its own, in order."""

    class Publisher:
        def __init__(self) -> None:
            self.sent: list[tuple] = []

        async def send(
            self, topic, value, key=None, partition=None, timestamp_ms=None, headers=None
        ):
            self.sent.append((topic, partition, key, value, headers))
            future = asyncio.get_running_loop().create_future()
            future.set_result(None)
            return future

    async def run() -> list[tuple]:
        publisher = Publisher()
        batch = CommitOrder(publisher).begin()
        await batch.send_many("t", [(b"a", b"1", None), (None, b"2", [("h", b"v")])], partition=2)
        await batch.acknowledged()
        return publisher.sent

    assert asyncio.run(run()) == [("t", 2, b"a", b"1", None), ("t", 2, None, b"2", [("h", b"v")])]
