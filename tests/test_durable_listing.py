"""The durable log keeps up with many small batches: the object store's listings cost the same whatever
the number of stored objects, and a consumer with the workers' fetch settings reads a partition of a
thousand small batches (before: a listing walked the whole folder, the broker gave up on it when the
fetch's 50 ms wait expired, and such a consumer read nothing at all). Real broker, real object store."""

from __future__ import annotations

import asyncio
import http.client
import statistics
import time

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from pipeline.stream.kafka.bulk_consumer import INGEST_FETCH_MAX_WAIT_MS, BulkConsumer
from pipeline.stream.local.embedded import FSYNC_ENV, EmbeddedObjectStore, EmbeddedServices, OBJECT_STORE_BUCKET

FOLDER = "clusters/c/topics/reports/partitions/0000000000/records/"


class _Client:
    """One keep-alive connection to the object store, authorised as the broker is."""

    def __init__(self, store: EmbeddedObjectStore):
        self.conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=30)
        self.auth = f"AWS4-HMAC-SHA256 Credential={store.access_key}/20260101/us-east-1/s3/aws4_request"

    def request(self, method: str, path: str, body: bytes = b"", **headers) -> tuple[int, bytes]:
        self.conn.request(method, f"/{OBJECT_STORE_BUCKET}/{path}", body=body,
                          headers={"Authorization": self.auth, **headers})
        resp = self.conn.getresponse()
        return resp.status, resp.read()


def _key(i: int) -> str:
    return f"{FOLDER}{i:020d}.batch"


def test_a_listing_page_costs_the_same_however_many_objects_the_folder_holds(tmp_path, monkeypatch):
    """The broker lists with no start-after, page after page; each page must cost what its keys cost. The
    same 99-key page is timed over a folder of 300 and of 6,000 objects (localbucket walked, sorted and
    stat-ed the whole folder for every page: ~20x apart)."""
    monkeypatch.setenv(FSYNC_ENV, "off")  # the objects are written in seconds; the listing is what is timed
    store = EmbeddedObjectStore(tmp_path / "objects").start()
    try:
        client = _Client(store)
        stored, times = 0, {}
        for size in (300, 6_000):
            for i in range(stored, size):
                assert client.request("PUT", _key(i), b"b" * 64, **{"If-None-Match": "*"})[0] == 200
            stored = size
            query = f"?list-type=2&prefix={FOLDER}&start-after={_key(size - 100)}"
            samples = []
            for _ in range(7):
                started = time.perf_counter()
                status, body = client.request("GET", query)
                samples.append(time.perf_counter() - started)
                assert status == 200 and body.count(b"<Key>") == 99
            times[size] = statistics.median(samples)
        # a bound far below the folder's 20x growth and far above the noise of one machine's scheduling
        assert times[6_000] < 4 * times[300] + 0.002, times
        # the index is rebuilt from disk at start: the same keys, sizes, times and ETags, a deletion kept
        assert client.request("DELETE", _key(5_000))[0] == 204
        query = f"?list-type=2&prefix={FOLDER}&start-after={_key(4_990)}"
        before = client.request("GET", query)[1]
        store.stop()
        store.start()
        assert _Client(store).request("GET", query)[1] == before and _key(5_000).encode() not in before
    finally:
        store.stop()


def test_a_consumer_keeps_up_with_a_thousand_small_batches_on_the_durable_log(tmp_path, monkeypatch):
    """One partition of 1,000 stored batches (2 reports each, as a plain client with linger 0 stores them
    when it sends slowly), read by a consumer with the workers' settings: all of it, within a bound."""
    monkeypatch.setenv(FSYNC_ENV, "off")  # the batches are written in seconds
    with EmbeddedServices(data_dir=tmp_path / "svc", durable_log=True) as svc:
        store = svc.storage
        admin = KafkaAdminClient(bootstrap_servers=svc.broker.bootstrap)
        admin.create_topics([NewTopic("reports", 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=svc.broker.bootstrap, linger_ms=0, enable_idempotence=False)
        batches = 1_000
        for b in range(batches):
            producer.send("reports", b'{"user":"u%d","step":1}' % (2 * b), partition=0)
            producer.send("reports", b'{"user":"u%d","step":1}' % (2 * b + 1), partition=0)
            producer.flush()
        producer.close()
        assert len(list((store.data_dir / OBJECT_STORE_BUCKET).rglob("*.batch"))) >= batches

        async def read_all() -> int:
            async def from_start(tps):
                return {tp: 0 for tp in tps}

            async def nothing(_tps):
                return None

            consumer = BulkConsumer(svc.broker.bootstrap, "listing-test", ["reports"], from_start, nothing,
                                    fetch_max_wait_ms=INGEST_FETCH_MAX_WAIT_MS)
            await consumer.start()
            read = 0
            try:
                async def drain():
                    nonlocal read
                    async for fetch in consumer.batches():
                        read += sum(len(records) for records in fetch.values())
                        if read >= 2 * batches:
                            return

                await asyncio.wait_for(drain(), timeout=90)
            except asyncio.TimeoutError:
                pass
            finally:
                await consumer.stop()
            return read

        assert asyncio.run(read_all()) == 2 * batches
