"""The project's readers get every record although the embedded broker reports short log ends.

The embedded broker (Tansu) answers ListOffsets "latest" with the last record batch's base offset
+ 1 instead of the offset after the last record (the Kafka protocol's high watermark). These tests
write multi-record batches to the real embedded broker and check the log-end probe, the public-topic
reader and the consumer-lag gauge against the number of records actually written.
"""

from __future__ import annotations

import orjson
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata

from pipeline.stream.kafka import consumer_lag
from pipeline.stream.local.embedded import EmbeddedBroker
from pipeline.stream.kafka.log_end import log_ends


@pytest.fixture(scope="module")
def broker():
    b = EmbeddedBroker().start()
    yield b
    b.stop()


def _topic(broker, name: str, partitions: int = 1) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(name, partitions, 1)])
    admin.close()


def _send_batches(broker, topic: str, batches: list[list[bytes]], partition: int = 0) -> None:
    """Each inner list goes out as one produce request (one record batch): flush between them."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=100, batch_size=1 << 20)
    for values in batches:
        for v in values:
            producer.send(topic, value=v, partition=partition)
        producer.flush()
    producer.close()


def test_log_ends_is_the_offset_after_the_last_record(broker):
    _topic(broker, "ends", partitions=3)
    _send_batches(broker, "ends", [[b"a"] * 5, [b"b"] * 7])
    _send_batches(broker, "ends", [[b"c"]], partition=1)
    tps = [TopicPartition("ends", p) for p in range(3)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    reported = consumer.end_offsets(tps)
    consumer.close()
    # What the broker's ListOffsets says (6 on Tansu 0.6.0; 12 on a broker that follows the protocol)
    assert reported[tps[0]] <= 12
    assert log_ends(broker.bootstrap, tps) == {tps[0]: 12, tps[1]: 1, tps[2]: 0}


def test_read_topics_reads_every_record_of_the_last_batch(broker):
    """800 manifests in two batches of 400: ListOffsets says 401, and one poll returns 500 records,
    so a reader that stops at the reported end loses 300 of them."""
    from pipeline.consumer import read_topics

    names = {"releases": "rt.releases", "synthetic": "rt.synthetic", "alerts": "rt.alerts"}
    for topic in names.values():
        _topic(broker, topic)
    manifests = [orjson.dumps({"release": f"r{i % 8}", "type": "cumulative", "step": i // 8 + 1, "horizon": 100})
                 for i in range(800)]
    _send_batches(broker, names["releases"], [manifests[:400], manifests[400:]])
    store = read_topics(broker.bootstrap, names, timeout=30)
    assert sum(len(p.manifests) for p in store.panels.values()) == 800
    assert all(sorted(p.complete_steps) == list(range(1, 101)) for p in store.panels.values())


def test_consumer_lag_counts_the_whole_last_batch(broker):
    _topic(broker, "lag-batches")
    _send_batches(broker, "lag-batches", [[b"x"] * 5, [b"y"] * 7])
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="lag-batches-group",
                             enable_auto_commit=False)
    consumer.commit({TopicPartition("lag-batches", 0): OffsetAndMetadata(4, "", -1)})
    consumer.close()
    # a process that may fetch the topic (the releaser, for its own topics) probes the true end
    monitor = consumer_lag.ConsumerLagMonitor(broker.bootstrap, {"lag-batches-group": ["lag-batches"]},
                                   readable={"lag-batches"})
    try:
        assert monitor.poll_once() == {("lag-batches", 0): 12 - 4}
    finally:
        monitor._close_clients()
    # one that may only list its offsets (the releaser, for the workers' raw reports) never fetches: on this
    # broker its ListOffsets end is short by the rest of the last batch (6, not 12), so the lag reads short
    monitor = consumer_lag.ConsumerLagMonitor(broker.bootstrap, {"lag-batches-group": ["lag-batches"]})
    try:
        assert monitor.poll_once() == {("lag-batches", 0): 6 - 4}
    finally:
        monitor._close_clients()


def test_worker_resumes_at_its_checkpoint_inside_the_last_batch(tmp_path, monkeypatch):
    """A checkpoint whose offset lies inside the last record batch (a checkpoint written after feedback
    records the last handled report) is past the short ListOffsets end. The worker must resume there,
    not take the log for lost and re-read it from offset 0 (which would dead-letter every report again)."""
    import asyncio

    from aiokafka import TopicPartition as ATopicPartition

    from jobs.worker import IngestWorker
    from pipeline.config import load_config
    from pipeline.serialization import dumps_state
    from pipeline.stream.local.embedded import EmbeddedServices
    from pipeline.stream.ingest.partition_state import PartitionState
    from pipeline.stream.process.runtime import Runtime
    from support.stores import WritableStore
    from jobs.eval.testbed import write_panel_deployment
    from pipeline.stream.kafka.topics import ensure_topics

    from pipeline.stream.control.signing_keys import ensure_keys
    from pipeline.stream.state.identity import establish_identity

    # the public keys, as `up` gives a worker
    for variable, path in ensure_keys(tmp_path / "control").public_env().items():
        monkeypatch.setenv(variable, path)
    with EmbeddedServices() as svc:
        dep = load_config(write_panel_deployment(tmp_path, svc, "resume", n=10, horizon=3, partitions=1))
        names = ensure_topics(svc.broker.bootstrap, dep)
        reports = [orjson.dumps({"user": f"u{i}", "step": 1, "values": {"pov": 1}}) for i in range(10)]
        _send_batches(svc.broker, names["reports"], [reports[:5], reports[5:]])  # offsets 0..4, 5..9
        rt = Runtime(dep, svc.broker.bootstrap, svc.redis.url)
        establish_identity(dep, rt.roster.ids, rt.store(), "releaser")  # a worker waits for it
        state = PartitionState(dep, 0, rt.roster.rows_of(0, 1), rt.roster.n)
        state.offset = 8  # handled through offset 8: resume at 9, inside the last batch (base 5)
        WritableStore(rt.store().r, dep.name).save_checkpoint(0, dumps_state(state.get_state()))

        async def assign():
            worker = IngestWorker(rt)
            await worker.consumer.consumer.start()  # connected, not subscribed: we call the callback
            try:
                return await worker._on_assign({ATopicPartition(names["reports"], 0)})
            finally:
                await worker.consumer.consumer.stop()

        positions = asyncio.run(assign())
        assert positions == {ATopicPartition(names["reports"], 0): 9}
