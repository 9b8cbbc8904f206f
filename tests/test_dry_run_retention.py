"""`dpstream produce --dry-run` on the durable log after its retention deleted the close marker the
count's windows start from (docs/own-data.md, "Dry run"): the last step closed before the first
record left is the one the workers' history records, so reports and an upload sent after that
close still count (`dpstream up`: embedded durable broker with its retention, Redis, a worker
and the releaser)."""

from __future__ import annotations

import time
import uuid

import orjson

from support.cli import deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture
from support.report_log import TOPIC, RawUpload, dry_run, report_csv, with_max_ahead, workers_hold
from support.up import wait_released


def _first_offsets(broker: str) -> dict[int, int]:
    """The offset of the first record left on each reports partition."""
    from kafka import KafkaConsumer, TopicPartition

    from pipeline.connections import kafka_security

    consumer = KafkaConsumer(bootstrap_servers=broker, **kafka_security(),
                             enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [TopicPartition(TOPIC, p) for p in range(2)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    first: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while len(first) < len(tps) and time.monotonic() < deadline:
        for tp, msgs in consumer.poll(timeout_ms=200).items():
            first.setdefault(tp.partition, msgs[0].offset)
    consumer.close()
    return first


def test_the_dry_run_counts_after_retention_deleted_its_first_marker(deployment,  # noqa: F811
                                                                      tmp_path):
    """``max_ahead: 1``: after step 2's close and release, the retention deletes step 1's marker,
    where the count of step 3 (open, in the window 2..3 since step 1's close) starts. Before: the
    dry run read the reports after it as if no step were closed (window 1..2) and foresaw 0
    duplicates, "exact", of the 140 the workers hold (100 reports, an upload of 40 committed after
    step 2's close). Now 140."""
    from pipeline.stream.kafka.log_end import log_ends

    path, env, cfg = with_max_ahead(deployment, 1)
    with running(path, env, tmp_path) as broker:
        from kafka import TopicPartition

        dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "one.csv", 1, range(800)), env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        after_close = log_ends(broker, [TopicPartition(TOPIC, p) for p in range(2)])
        wait_released(path, env, 1)
        time.sleep(6)  # a retention round samples the checkpoints at step 1's close
        dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "three.csv", 3, range(100)), env=env)
        upload = RawUpload(broker, 3, range(100, 140))
        dpstream("close", *cfg, "--step", "2", env=env)
        wait_released(path, env, 2)
        deadline = time.monotonic() + 60
        while any(_first_offsets(broker)[tp.partition] < end for tp, end in after_close.items()):
            assert time.monotonic() < deadline, "the retention deleted nothing"
            time.sleep(1)
        upload.end(commit=True)
        count, out = dry_run(cfg, env, tmp_path / "a.csv", 3, range(200))
        assert count == 140, out
        assert "exact for" in out, out
        assert workers_hold(cfg, env, 3) == 140


def test_the_count_is_a_lower_bound_when_the_retention_deleted_what_may_count(tmp_path,
                                                                              redis_client):
    """Against the embedded durable broker, with batches deleted through its retention
    (:meth:`LogRetention.trim`) past what the workers' history lets the dry run stand in for:
    partition 0 loses an upload's message committed after step 1's close (its commit states 1,
    none is left), partition 1 reports of step 3 sent after step 1's close. Before, the count
    left out what was deleted and called itself exact; now it says it is a lower bound."""
    from kafka import KafkaProducer

    from pipeline.config import parse_config
    from pipeline.held_reports import held_reports
    from pipeline.stream.ingest.intake_view import IntakeView
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.ingest.uploads import end_record, upload_headers
    from pipeline.stream.kafka.messages import CONTROL_HEADER
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.embedded import EmbeddedServices
    from pipeline.stream.local.retention import LogRetention
    from pipeline.stream.state.store import StateStore

    def report(user: int) -> bytes:
        return orjson.dumps({"user": f"u{user}", "step": 3, "values": {"pov": user % 2}})

    def marker(step: int) -> tuple[bytes, list]:
        value = {"step": step, "closed_at": 1, "action": "close"}
        return orjson.dumps(value), [(CONTROL_HEADER, b"close")]

    upload, late_upload = uuid.uuid4().hex, uuid.uuid4().hex
    batch = orjson.dumps({"columns": {"user": [f"u{i}" for i in range(15, 20)], "step": 3,
                                      "pov": [i % 2 for i in range(15, 20)]}})
    later = orjson.dumps({"columns": {"user": [f"u{i}" for i in range(10, 15)], "step": 3,
                                      "pov": [i % 2 for i in range(10, 15)]}})
    logs = {  # (value, headers) in log order: offsets 0, 1, ...
        0: [(batch, upload_headers(upload)), marker(1), end_record(upload, 1, True)]
        + [(report(i), []) for i in range(10)]
        + [(later, upload_headers(late_upload)), marker(2), end_record(late_upload, 1, True)],
        1: [marker(1)] + [(report(i), []) for i in range(20, 30)] + [marker(2)],
    }
    with EmbeddedServices(data_dir=tmp_path / "svc", durable_log=True) as svc:
        dep = parse_config({
            "name": "trim", "broker": svc.broker.bootstrap, "redis": "redis://r:6379/0",
            "roster": {"size": 40}, "horizon": 4, "steps": {"max_ahead": 1},
            "topics": {"partitions": 2}, "attributes": {"pov": {"type": "binary"}},
            "budget": {"rho": 0.5},
            "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}],
        })
        names = ensure_topics(svc.broker.bootstrap, dep)
        producer = KafkaProducer(bootstrap_servers=svc.broker.bootstrap, linger_ms=0)
        for p, records in logs.items():
            for value, headers in records:  # one batch each
                producer.send(names["reports"], value, partition=p, headers=headers).get(30)
        producer.close()
        markers = {p: [o for o, (_, h) in enumerate(r) if h and h[0][0] == CONTROL_HEADER]
                   for p, r in logs.items()}
        view = IntakeView(2, 2, {p: {"closed": 2, "open": {}, "history": {
            str(t): {"marker": o} for t, o in enumerate(m, start=1)}} for p, m in markers.items()})
        roster = Roster.from_config(dep.roster)

        def held():
            return held_reports(dep, svc.broker.bootstrap, view, {3}, roster, timeout=60)

        whole = held()
        assert int(whole.rows[3].sum()) == 30 and "exact for" in whole.note, whole
        retention = LogRetention(svc.storage, StateStore(redis_client, "trim"), names, 2)
        # partition 0: the upload's message and step 1's marker; partition 1: the marker and
        # three reports after it
        assert retention.trim(names["reports"], 0, 2) == 2
        assert retention.trim(names["reports"], 1, 4) == 4
        trimmed = held()
    assert int(trimmed.rows[3].sum()) == 30 - 5 - 3, trimmed
    assert trimmed.deleted == {0: 2, 1: 4}, trimmed
    assert "a lower bound: the log's retention deleted records of partitions [0, 1]" in \
        trimmed.note
