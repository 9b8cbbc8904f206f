"""An upload in one pass, as the reports log shows it (real embedded broker; no worker: what the
uploader writes). Every message carries the upload's header; once every one is acknowledged, each
partition sent to gets exactly one commit record after its messages, stating how many it got, and
the receipt waits for the commits. A stop after some messages were sent (a bad report or a refused
step in a later chunk, Ctrl-C) sends an abort record to each partition sent to instead; a bad
report in the first chunk sends nothing at all."""

from __future__ import annotations

import itertools

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import parse_config
from pipeline.fates import Receipt
from pipeline.stream.ingest.corrections import REPLACE_HEADER
from pipeline.stream.ingest.report_files import ReportFileError
from pipeline.stream.ingest.uploads import UPLOAD_HEADER, end_of, seq_of, upload_of
from pipeline.stream.kafka.topics import ensure_topics
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.upload import StepRefused, UploadAborted, open_upload, send_upload, upload_file

USERS = 1000
_names = itertools.count()


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    with EmbeddedServices(broker_log=tmp_path_factory.mktemp("broker") / "broker.log") as svc:
        yield svc


@pytest.fixture
def dep(services, monkeypatch):
    """A deployment of its own (its own reports topic) per test; chunks of 50 reports."""
    monkeypatch.setenv("DPSTREAM_UPLOAD_CHUNK_ROWS", "50")
    dep = parse_config({
        "name": f"staged-{next(_names)}",
        "broker": services.broker.bootstrap,
        "redis": services.redis.url,
        "roster": {"size": USERS},
        "horizon": 4,
        "topics": {"partitions": 3},
        "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 1.0},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    })
    ensure_topics(services.broker.bootstrap, dep)
    return dep


def _topic(dep) -> str:
    from pipeline.stream.kafka.topics import topic_names

    return topic_names(dep)["reports"]


def _write(path, users: list[str], steps: list[int]):
    table = pa.table({"user": users, "step": steps, "poverty": [i % 2 for i in range(len(users))]})
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        path.write_text("user,step,poverty\n" + "".join(
            f"{u},{t},{i % 2}\n" for i, (u, t) in enumerate(zip(users, steps))))
    return path


def _log(bootstrap: str, topic: str) -> dict[int, list]:
    """Every record of the topic, per partition, in log order."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out: dict[int, list] = {tp.partition: [] for tp in parts}
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition] += records
        return out
    finally:
        consumer.close()


def _ends(log: dict[int, list], upload: str) -> dict[int, list[tuple[str, int]]]:
    """Partition -> (end, stated message count) of the upload's end records, in log order."""
    return {
        p: [(end_of(r.headers), orjson.loads(r.value)["messages"]) for r in records
            if end_of(r.headers) and upload_of(r.headers) == upload]
        for p, records in log.items()
    }


@pytest.mark.parametrize("suffix,replace", [("parquet", False), ("csv", True)])
def test_every_message_carries_the_upload_and_each_partition_gets_one_commit_after_them(
        services, dep, tmp_path, suffix, replace):
    """Before: the messages carried no upload header and no end record followed them."""
    path = _write(tmp_path / f"s1.{suffix}", [f"u{i}" for i in range(USERS)], [1] * USERS)
    result = upload_file(path, dep, services.broker.bootstrap, replace=replace)
    assert result.committed and result.acknowledged == USERS and not result.failed
    assert len(result.upload) == 32 and int(result.upload, 16) >= 0
    log = _log(services.broker.bootstrap, _topic(dep))
    commits = {}
    for p, records in log.items():
        messages = [r for r in records if not end_of(r.headers)]
        assert all(upload_of(r.headers) == result.upload for r in messages)
        assert all((dict(r.headers).get(REPLACE_HEADER) == b"1") == replace for r in messages)
        # numbered on their partition, so a copy stored by a retried send is held once
        assert [seq_of(r.headers) for r in messages] == list(range(len(messages)))
        assert all(r.key is None for r in records[-1:])
        if not messages:
            assert not records
            continue
        # one commit, after every message of the partition, counting them
        assert _ends(log, result.upload)[p] == [("commit", len(messages))]
        assert end_of(records[-1].headers) == "commit" and records[-1].partition == p
        commits[p] = records[-1].offset
    assert len(commits) == 3  # 1000 users: every partition owns some (murmur2)
    assert sum(1 for r in itertools.chain(*log.values()) if not end_of(r.headers)) >= 3
    # the receipt: every report, and the wait covers the commits (the workers apply them there)
    receipt = result.receipt
    assert receipt.reports == USERS and receipt.last_offsets() == commits
    assert receipt.reports_after({p: off - 1 for p, off in commits.items()}) == USERS
    assert receipt.reports_after(commits) == 0


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_a_bad_report_in_a_later_chunk_aborts_what_was_sent(services, dep, tmp_path, suffix):
    """Before: the whole file was checked first, then read again and sent. Now the chunks before
    the bad report are on the log when it is found: each partition sent to gets an abort record
    counting its messages, and none gets a commit."""
    users = [f"u{i}" for i in range(USERS)] + ["u3"]  # u3 again, in the last chunk
    path = _write(tmp_path / f"late.{suffix}", users, [1] * len(users))
    with pytest.raises(UploadAborted) as stopped:
        upload_file(path, dep, services.broker.bootstrap)
    cause, result = stopped.value.cause, stopped.value.result
    assert isinstance(cause, ReportFileError) and "second report for user 'u3'" in str(cause)
    assert ("row 1001" if suffix == "parquet" else f"{path}:1002:") in str(cause)
    assert not result.committed and not result.unended and 0 < result.sent <= USERS
    log = _log(services.broker.bootstrap, _topic(dep))
    for p, records in log.items():
        messages = [r for r in records if not end_of(r.headers)]
        assert all(upload_of(r.headers) == result.upload for r in messages)
        assert _ends(log, result.upload)[p] == ([("abort", len(messages))] if messages else [])
        assert not messages or end_of(records[-1].headers) == "abort"
    assert sum(len(r) for r in log.values()) > 3  # messages were sent before the bad report


def test_a_bad_report_in_the_first_chunk_sends_nothing(services, dep, tmp_path):
    users = [f"u{i}" for i in range(40)] + ["u3"]
    path = _write(tmp_path / "early.parquet", users, [1] * len(users))
    with pytest.raises(ReportFileError, match="row 41: a second report for user 'u3'"):
        upload_file(path, dep, services.broker.bootstrap)
    assert not any(_log(services.broker.bootstrap, _topic(dep)).values())


def test_a_step_refused_in_a_later_chunk_aborts(services, dep, tmp_path):
    """A step the workers would refuse (closed, too far ahead) is asked about when its first
    report comes: found in the third chunk, after two were sent."""
    users = [f"u{i}" for i in range(100)] + [f"u{i}" for i in range(100)]
    path = _write(tmp_path / "two.parquet", users, [1] * 100 + [3] * 100)
    upload = open_upload(path, dep)
    with pytest.raises(UploadAborted) as stopped:
        send_upload(upload, services.broker.bootstrap, _topic(dep),
                    refused=lambda step: "too far ahead" if step == 3 else None)
    cause = stopped.value.cause
    assert isinstance(cause, StepRefused) and (cause.step, cause.position) == (3, 100)
    ends = _ends(_log(services.broker.bootstrap, _topic(dep)), stopped.value.result.upload)
    assert {end for each in ends.values() for end, _ in each} == {"abort"}


def test_ctrl_c_mid_send_sends_abort_records(services, dep, tmp_path):
    """KeyboardInterrupt once the first message is acknowledged (the progress callback runs in
    the sending thread, where Ctrl-C lands): abort records, no commit, the interrupt as cause."""
    path = _write(tmp_path / "s1.parquet", [f"u{i}" for i in range(USERS)], [1] * USERS)

    pressed = []

    def interrupt(done: int, total: int) -> None:
        if not pressed:  # once, as a key press
            pressed.append(done)
            raise KeyboardInterrupt

    with pytest.raises(UploadAborted) as stopped:
        upload_file(path, dep, services.broker.bootstrap, progress=interrupt)
    assert isinstance(stopped.value.cause, KeyboardInterrupt) and pressed[0] < USERS
    ends = _ends(_log(services.broker.bootstrap, _topic(dep)), stopped.value.result.upload)
    assert {end for each in ends.values() for end, _ in each} == {"abort"}


def test_the_receipt_counts_an_uploads_reports_handled_once_its_commit_is():
    """Messages before a commit record are applied at the commit; other messages where they are
    (another producer's, or a partition's messages past its commit)."""
    receipt = Receipt("t")
    for offset, reports in [(3, 10), (5, 20)]:
        receipt.add(0, offset, reports)
    receipt.add_commit(0, 9)
    receipt.add(1, 4, 7)  # no commit on partition 1
    assert receipt.reports == 37
    assert receipt.reports_after({0: 8, 1: 4}) == 30  # partition 0's commit not handled
    assert receipt.reports_after({0: 9, 1: 3}) == 7
    assert receipt.reports_after({0: 9, 1: 4}) == 0
    assert UPLOAD_HEADER == "dpstream-upload"


def test_messages_not_acknowledged_abort_the_upload_and_say_so(services, dep, tmp_path,
                                                               monkeypatch):
    """The broker stops answering (SIGSTOP) once the file is handed to the producer: no message
    is acknowledged within the wait, so no commit is sent; the abort records cannot be
    acknowledged either, and the result says which partitions' messages the workers may hold
    (dead-lettered ``uncommitted`` at the second close)."""
    import os
    import signal

    import pipeline.upload_send
    from pipeline.upload import EarlyProducer

    monkeypatch.setattr(pipeline.upload_send, "ABORT_SECONDS", 2.0)  # the abort's wait, bounded
    path = _write(tmp_path / "s1.parquet", [f"u{i}" for i in range(USERS)], [1] * USERS)
    broker = services.broker._proc.pid  # the broker process itself (no gate here)
    early = EarlyProducer(services.broker.bootstrap, _topic(dep))
    early.wait()  # connected, the topic's partitions known
    try:
        os.kill(broker, signal.SIGSTOP)
        result = send_upload(open_upload(path, dep), services.broker.bootstrap, _topic(dep),
                             timeout=2.0, early=early)
    finally:
        os.kill(broker, signal.SIGCONT)
    assert not result.committed and result.failed and result.acknowledged == 0
    assert result.failed[0][1] == "not acknowledged by the broker within 2 s"
    assert result.sent == USERS and sorted(result.unended) == [0, 1, 2]
    ends = _ends(_log(services.broker.bootstrap, _topic(dep)), result.upload)
    assert "commit" not in {end for each in ends.values() for end, _ in each}


def test_a_jsonl_file_pyarrow_stops_reading_part_way_is_sent_whole_once(
        services, dep, tmp_path, monkeypatch):
    """A JSONL file whose values change type part way (a code where labels were): pyarrow reads
    the first blocks, then cannot; the per-report reader, after checking the whole file, goes on
    from the first report not sent yet. Every report is sent once, with its value, committed."""
    from pipeline.stream.ingest.reports import ReportParser
    from pipeline.stream.ingest.roster import Roster

    dep = parse_config(dict(
        name=f"staged-{next(_names)}", broker=services.broker.bootstrap,
        redis=services.redis.url, roster={"size": USERS}, horizon=4, topics={"partitions": 3},
        attributes={"status": {"type": "categorical", "values": ["employed", "unemployed"]}},
        budget={"epsilon": 4.0, "delta": 1e-6},
        releases=[{"name": "band", "type": "band_monitor", "attribute": "status",
                   "value": "unemployed", "low": 10, "high": 100, "share": 1.0}]))
    ensure_topics(services.broker.bootstrap, dep)
    labels = ["employed", "unemployed"]
    lines = [orjson.dumps({"user": f"u{i}", "step": 1, "values": {
        "status": labels[i % 2] if i < 600 else i % 2}}) for i in range(USERS)]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = upload_file(path, dep, services.broker.bootstrap)
    assert result.committed and result.acknowledged == USERS
    messages = [r.value for records in _log(services.broker.bootstrap, _topic(dep)).values()
                for r in records if not end_of(r.headers)]
    parsed = ReportParser(Roster.from_range(USERS), dep.attributes, dep.horizon).parse(messages)
    assert not parsed.rejections
    assert sorted(zip(parsed.rows.tolist(), parsed.codes["status"].tolist())) == [
        (i, i % 2) for i in range(USERS)]


def test_an_upload_over_the_reports_a_partition_may_take_is_aborted(services, dep, tmp_path,
                                                                      monkeypatch):
    """A committed report's place in its upload is 24 bits on its partition: `produce` stops a
    file that would send more to one partition (aborted, nothing accepted), where the ranks would
    have run into the next offset's. The limit lowered to 100 here."""
    from pipeline.stream.ingest import uploads

    monkeypatch.setattr(uploads, "MAX_UPLOAD_REPORTS", 100)
    path = _write(tmp_path / "many.csv", [f"u{i}" for i in range(USERS)], [1] * USERS)
    with pytest.raises(UploadAborted) as stopped:
        upload_file(path, dep, services.broker.bootstrap)
    cause = stopped.value.cause
    assert isinstance(cause, ReportFileError) and "more than 100 of its reports" in str(cause)
    assert not stopped.value.result.committed
    log = _log(services.broker.bootstrap, _topic(dep))
    assert all(not records or end_of(records[-1].headers) == "abort" for records in log.values())
