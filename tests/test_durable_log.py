"""The embedded broker's durable log: what the broker acknowledged survives a kill -9 of the broker and of
its object store mid-produce, and the object store gives the compare-and-swap the broker's offsets rely on
(real Tansu broker, real object-store process, kafka-python clients)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from support.object_store import store_request as _request

from pipeline.stream.local.embedded import EmbeddedObjectStore, EmbeddedServices


def test_object_store_conditional_writes_are_atomic(tmp_path):
    """The broker advances a partition's watermark by read, modify, ``PUT If-Match: <etag>``, retrying on
    412: concurrent increments must never both succeed on one version (plain localbucket ignores If-Match,
    so two produce requests could take the same offsets)."""
    store = EmbeddedObjectStore(tmp_path / "objects").start()
    try:
        assert _request(store, "PUT", "w.json", b"0", **{"If-None-Match": "*"})[0] == 200
        assert _request(store, "PUT", "w.json", b"9", **{"If-None-Match": "*"})[0] == 412  # exists
        assert _request(store, "PUT", "w.json", b"9", **{"If-Match": '"not-the-etag"'})[0] == 412
        assert _request(store, "PUT", "nope.json", b"9", **{"If-Match": '"x"'})[0] == 412  # no such object
        status, etag, _ = _request(store, "GET", "w.json")
        assert status == 200 and _request(store, "GET", "w.json", **{"If-None-Match": etag})[0] == 304
        assert _request(store, "GET", "w.json", Authorization="AWS4-HMAC-SHA256 Credential=other/x")[0] == 403

        def increment(_):
            while True:
                _, etag, value = _request(store, "GET", "w.json")
                status = _request(store, "PUT", "w.json", str(int(value) + 1).encode(), **{"If-Match": etag})[0]
                if status == 200:
                    return
                assert status == 412

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(increment, range(200)))
        assert _request(store, "GET", "w.json")[2] == b"200"  # no lost update

        # listings (a fetch lists the partition's batches): every key under the prefix, in order, across pages
        keys = [f"t/p1/records/{i:020d}.batch" for i in range(1200)]
        for key in keys + ["t/p10/records/x.batch", "t/p2/records/y.batch"]:
            assert _request(store, "PUT", key, b"b", **{"If-None-Match": "*"})[0] == 200
        for prefix, expected in (("t/p1/records/", keys), ("t/p1", keys + ["t/p10/records/x.batch"]),
                                 ("t/p1/records/0000000000000000119", keys[1190:])):
            listed, token = [], None
            while True:
                query = f"?list-type=2&prefix={prefix}" + (f"&continuation-token={token}" if token else "")
                body = _request(store, "GET", "", path=query)[2].decode()
                listed += re.findall(r"<Key>([^<]+)</Key>", body)
                token = (re.findall(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", body) or [None])[0]
                if token is None:
                    break
            assert listed == expected, (prefix, len(listed))
    finally:
        store.stop()


def test_nothing_acknowledged_is_lost_when_the_broker_or_its_storage_is_killed(tmp_path):
    with EmbeddedServices(data_dir=tmp_path / "svc", durable_log=True) as svc:
        boot = svc.broker.bootstrap
        admin = KafkaAdminClient(bootstrap_servers=boot)
        admin.create_topics([NewTopic("t", 2, 1)])
        admin.close()
        acked, failed, lock = set(), [0], threading.Lock()
        stop = threading.Event()

        def produce(tag: str) -> None:
            # two producers writing the same partitions at once: concurrent watermark updates. Not idempotent,
            # as pipeline.stream.kafka.report_producer: Tansu 0.6 acknowledges a batch retried after a kill -9 as a
            # duplicate although it never stored it (its sequence bookkeeping precedes the write).
            producer = KafkaProducer(bootstrap_servers=boot, acks="all", retries=10, linger_ms=20,
                                     reconnect_backoff_ms=50, request_timeout_ms=5000, enable_idempotence=False)
            i = 0
            while not stop.is_set():
                value = f"{tag}-{i}".encode()
                fut = producer.send("t", key=str(i % 7).encode(), value=value)
                fut.add_callback(lambda _md, v=value: (lock.acquire(), acked.add(v), lock.release()))
                fut.add_errback(lambda _e: failed.__setitem__(0, failed[0] + 1))
                i += 1
                if i % 200 == 0:
                    time.sleep(0.02)
            try:
                producer.flush(timeout=30)
            finally:
                producer.close(timeout=5)

        threads = [threading.Thread(target=produce, args=(tag,)) for tag in "ab"]
        for t in threads:
            t.start()
        for service in (svc.broker, svc.storage, svc.broker):  # kill -9 each mid-produce, restart in place
            time.sleep(0.7)
            acked_before = len(acked)
            os.kill(service.pid, signal.SIGKILL)
            service._proc.wait()
            time.sleep(0.3)
            service.start()
            assert acked_before > 0
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert len(acked) > 1000, (len(acked), failed[0])

        svc.broker.stop()  # read back through a fresh broker: from the object store, not a broker's memory
        svc.broker.start()
        consumer = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest", consumer_timeout_ms=2500,
                                 enable_auto_commit=False)
        tps = [TopicPartition("t", p) for p in (0, 1)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        read, offsets = set(), {0: [], 1: []}
        for msg in consumer:
            read.add(msg.value)
            offsets[msg.partition].append(msg.offset)
        consumer.close()
        assert acked <= read, f"{len(acked - read)} acknowledged records lost"
        for partition, seen in offsets.items():  # one record per offset, in order
            assert seen == sorted(set(seen)), f"partition {partition}: offsets repeated or out of order"
