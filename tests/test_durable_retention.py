"""Retention of the durable log: only batches wholly before the checkpoints sampled before the last release
are deleted, the log's end and every record from the retention point on stay readable (real broker,
object store and Redis)."""

from __future__ import annotations

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from pipeline.serialization import dumps_state
from pipeline.stream.kafka.log_end import log_ends
from pipeline.stream.local.embedded import OBJECT_STORE_BUCKET, EmbeddedServices
from pipeline.stream.local.retention import LogRetention, deletable
from pipeline.stream.state.store import StateStore

NAMES = {"reports": "r-reports", "repartition": "r-repartition"}


def test_only_batches_wholly_before_the_point_are_deletable_and_never_the_last():
    assert deletable([0, 5, 12, 20], 12) == [0, 5]
    assert deletable([0, 5, 12, 20], 11) == [0]  # 5..11 holds offset 11
    assert deletable([0, 5, 12, 20], 1_000) == [0, 5, 12]  # the last batch holds the log's end
    assert deletable([0], 1_000) == [] and deletable([0, 5], 0) == []


def _batches(svc, topic: str) -> list[int]:
    root = svc.storage.data_dir / OBJECT_STORE_BUCKET
    return sorted(int(p.stem) for p in root.rglob(f"topics/{topic}/partitions/0000000000/records/*.batch"))


def test_retention_trims_to_the_checkpoints_read_before_the_last_release(tmp_path, redis_client):
    with EmbeddedServices(data_dir=tmp_path / "svc", durable_log=True) as svc:
        admin = KafkaAdminClient(bootstrap_servers=svc.broker.bootstrap)
        admin.create_topics([NewTopic(NAMES["reports"], 1, 1), NewTopic(NAMES["repartition"], 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=svc.broker.bootstrap, linger_ms=0, enable_idempotence=False)
        for b in range(40):  # 120 records in 40 or more batches (linger 0: how they split is the client's)
            for i in range(3):
                producer.send(NAMES["reports"], f"{b}:{i}".encode(), partition=0)
            producer.flush()
        producer.close()
        stored = _batches(svc, NAMES["reports"])
        assert len(stored) >= 40

        def first_kept_holds(offset: int) -> None:  # the batch holding `offset` is the first one left
            kept = _batches(svc, NAMES["reports"])
            assert kept[0] <= offset < kept[1] and kept == [b for b in stored if b >= kept[0]]
            assert kept[-1] == stored[-1]
        store = StateStore(redis_client, "retention-test")
        retention = LogRetention(svc.storage, store, NAMES, partitions=1)

        def checkpoint(next_offset: int) -> None:
            state = {"offset": next_offset - 1, "repartition": {"resume": 0}}
            redis_client.set(store.keys.checkpoint(0), dumps_state(state))

        checkpoint(31)  # resumes at 31, inside the batch 30..32
        assert retention.round() == 0  # the first sample: nothing applies yet
        checkpoint(61)  # the worker moved on, no step released since the sample: nothing deleted
        assert retention.round() == 0
        redis_client.set(store.keys.pointer("released"), 1)
        assert retention.round() > 0  # the sample taken before the release: resuming at 31
        first_kept_holds(31)
        redis_client.set(store.keys.pointer("released"), 2)
        assert retention.round() > 0  # the sample of 61, taken while step 1 was the last released
        first_kept_holds(61)

        tp = TopicPartition(NAMES["reports"], 0)
        assert log_ends(svc.broker.bootstrap, [tp])[tp] == 120  # the end did not move
        consumer = KafkaConsumer(bootstrap_servers=svc.broker.bootstrap, enable_auto_commit=False,
                                 fetch_max_wait_ms=500)
        consumer.assign([tp])
        consumer.seek(tp, 61)  # where the worker resumes
        offsets = []
        for _ in range(40):
            offsets += [r.offset for r in consumer.poll(timeout_ms=1000).get(tp, [])]
            if offsets and offsets[-1] == 119:
                break
        consumer.close()
        assert offsets == list(range(61, 120))
