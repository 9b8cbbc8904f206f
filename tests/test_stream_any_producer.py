"""Reports from any producer, through the real stream: embedded broker, Redis, worker and releaser
processes.

librdkafka's clients (confluent-kafka here) partition keys by CRC32 (``consistent_random``), spread
null keys over partitions, or pick partitions at random; the Java client, kafka-python and aiokafka
use murmur2, which is what owns a user (pipeline/stream/ingest/roster.py). Each step below is produced by
another client; every report must be accepted (none dead-lettered), and the releases must equal the
batch run of the library on the same panel — a report imputed instead of counted, counted twice, or
counted in the wrong step changes the synthetic columns. The matched producers' steps must add
nothing to ``repartition`` but the forwarded-through markers.

The crash test kills the only worker (``os._exit``, like kill -9) right after the broker
acknowledged reports it forwarded, before any checkpoint covers them, and then between a step's
acknowledged partial and its checkpoint: the restarts replay the source (forwarding copies) and the
owner (from its checkpoint); the outputs still equal the batch run and nothing is dead-lettered.
"""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from pipeline.config import load_config
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.process.faults import FAULT_EXIT_CODE
from pipeline.stream.kafka.log_end import log_ends
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.ingest.repartition import FORMAT_HEADER, ROWS, Forwarder
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore
from jobs.eval.testbed import binary_panel, write_panel_deployment

from support.stream_runs import check_outputs

confluent_kafka = pytest.importorskip("confluent_kafka")

N, P = 240, 2

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def _report(uid: str, step: int, value: int) -> bytes:
    return orjson.dumps({"user": uid, "step": step, "values": {"pov": int(value)}})


def send_confluent(broker, topic, roster, X, step, keyed=True, **conf) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": broker, "linger.ms": 5, **conf})
    for i, uid in enumerate(roster.ids):
        producer.produce(topic, value=_report(uid, step, X[i, step - 1]), key=uid.encode() if keyed else None)
    assert producer.flush(30) == 0


def send_kafka_python(broker, topic, roster, X, step) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker, linger_ms=5)
    for i, uid in enumerate(roster.ids):
        producer.send(topic, key=uid.encode(), value=_report(uid, step, X[i, step - 1]))
    producer.flush()
    producer.close()


def read_all(broker, topic, partitions):
    """Every record of ``topic`` (to its true end) as (partition, headers, value)."""
    from kafka import KafkaConsumer, TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = log_ends(broker, tps)
    consumer = KafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    out, seen, deadline = [], dict.fromkeys(tps, 0), time.monotonic() + 30
    while any(seen[tp] < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for tp, msgs in consumer.poll(timeout_ms=200).items():
            out += [(tp.partition, dict(m.headers), m.value) for m in msgs]
            seen[tp] = msgs[-1].offset + 1
    consumer.close()
    return out


def forwarded_steps(broker, names, dep, roster) -> tuple[set[int], set]:
    """Steps of the reports forwarded through ``repartition`` (batches of packed rows, each of a user
    of the partition it is on), and its markers as (partition, source, step)."""
    steps, markers = set(), set()
    forwarder = Forwarder(roster, dep.attributes, P, dep.horizon)
    for partition, headers, value in read_all(broker, names["repartition"], P):
        if headers.get(CONTROL_HEADER) == b"forwarded-through":
            marker = orjson.loads(value)
            markers.add((partition, marker["from"], marker["step"]))
            continue
        assert headers.get(FORMAT_HEADER) == ROWS
        rows = np.frombuffer(value, dtype=forwarder.dtype)
        assert (roster.owners(P)[rows["row"]] == partition).all()
        steps.update(rows["step"].tolist())
    return steps, markers


def test_every_producer_counts_the_same(services, tmp_path):
    path = write_panel_deployment(tmp_path, services, "any-producer", n=N, horizon=5, partitions=P, seed=19)
    dep = load_config(path)
    X = binary_panel(31, N, 5)
    roster = Roster.from_config(dep.roster)
    owners = roster.owners(P)
    with LocalCluster(path, dep, workers=2, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        topic = cluster.names["reports"]
        producers = {
            1: lambda t: send_confluent(cluster.broker, topic, roster, X, t),  # CRC32 of the key
            2: lambda t: send_confluent(cluster.broker, topic, roster, X, t, keyed=False),  # null keys
            3: lambda t: send_confluent(cluster.broker, topic, roster, X, t, partitioner="random"),
            4: lambda t: send_kafka_python(cluster.broker, topic, roster, X, t),  # murmur2: matched
            5: lambda t: drv.producer.send_step(t, {"pov": X[:, t - 1]}),  # the project's producer
        }
        for t, send in producers.items():
            send(t)
            drv.close(t)
        drv.shutdown()
        store = StateStore.from_url(services.redis.url, dep.name)
        check_outputs(dep, X, drv.panels, store)
        assert read_all(cluster.broker, cluster.names["dead-letter"], 1) == []
        steps, markers = forwarded_steps(cluster.broker, cluster.names, dep, roster)
        # the mismatched producers' steps were forwarded; the matched ones added markers only
        assert steps == {1, 2, 3}
        assert markers == {(p, q, t) for p in range(P) for q in range(P) for t in range(1, 6)}
        intake = store.intake()
        for t in range(1, 6):
            assert sum(intake[p]["history"][str(t)]["reported"] for p in range(P)) == N
            assert sum(intake[p]["history"][str(t)]["accepted"] for p in range(P)) == N
        crc_misplaced = sum(intake[p]["history"]["1"]["forwarded"] for p in range(P))
        assert 0 < crc_misplaced < N and all(intake[p]["history"][t]["forwarded"] == 0
                                             for p in range(P) for t in ("4", "5"))
        assert int((owners == 0).sum()) not in (0, N)


def test_worker_crash_after_forwarding_loses_and_duplicates_nothing(services, tmp_path):
    path = write_panel_deployment(tmp_path, services, "any-producer-crash", n=N, horizon=4, partitions=P, seed=23)
    dep = load_config(path)
    X = binary_panel(37, N, 4)
    roster = Roster.from_config(dep.roster)
    with LocalCluster(path, dep, workers=0, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        topic = cluster.names["reports"]
        cluster.spawn("worker", "worker-0", {"DPSTREAM_FAULT": "worker.after_forward@2"})
        send_confluent(cluster.broker, topic, roster, X, 1, partitioner="random")
        drv.close(1)
        send_confluent(cluster.broker, topic, roster, X, 2, partitioner="random")
        assert cluster.wait_exit("worker-0", timeout=90) == FAULT_EXIT_CODE  # forwarded, acknowledged, no checkpoint
        cluster.spawn("worker", "worker-0", {"DPSTREAM_FAULT": "worker.before_checkpoint@2"})
        drv.close(2, wait=False)
        assert cluster.wait_exit("worker-0", timeout=90) == FAULT_EXIT_CODE  # partial acknowledged, no checkpoint
        cluster.spawn("worker", "worker-0")
        drv.wait_released(2)
        for t in (3, 4):
            send_confluent(cluster.broker, topic, roster, X, t)
            drv.close(t)
        drv.shutdown()
        store = StateStore.from_url(services.redis.url, dep.name)
        check_outputs(dep, X, drv.panels, store)
        assert all(count == 1 for count in drv.manifests_seen.values())
        assert read_all(cluster.broker, cluster.names["dead-letter"], 1) == []
        steps, _ = forwarded_steps(cluster.broker, cluster.names, dep, roster)
        assert 2 in steps  # step 2 was forwarded (and, after the crash, forwarded again: copies skipped)
        intake = store.intake()
        assert sum(intake[p]["history"]["2"]["accepted"] for p in range(P)) == N
