"""The upload's producer, made while the file is checked, never creates the reports topic: the
embedded broker (Tansu) creates a topic that a metadata request names, whatever the request's
``allow_auto_topic_creation`` says, and a kafka-python producer sends such a request before its
first send. So the topic is checked first by listing the broker's topics (a metadata request for
all topics, which creates none), and a missing topic stops the upload with nothing sent and no
topic made: in ``upload_file`` and in ``dpstream produce`` (real broker and Redis)."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.cli.common import EXIT_CONFIG, EXIT_RUNTIME
from pipeline.config import parse_config
from pipeline.producer import TopicMissing
from pipeline.stream.local.embedded import EmbeddedServices
from support.topic_list import listed_topics


def _config(services=None, broker: str = "", redis: str = "") -> dict:
    return {
        "name": "early-producer",
        "broker": services.broker.bootstrap if services else broker,
        "redis": services.redis.url if services else redis,
        "roster": {"size": 50},
        "horizon": 4,
        "topics": {"partitions": 2},
        "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 1.0},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    }


def _file(tmp_path) -> str:
    path = tmp_path / "step1.parquet"
    users = [f"u{i}" for i in range(50)]
    pq.write_table(pa.table({"user": users, "step": [1] * 50, "poverty": [1] * 50}), path)
    return str(path)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    with EmbeddedServices(broker_log=tmp_path_factory.mktemp("broker") / "broker.log") as svc:
        yield svc


@pytest.mark.parametrize("allow", [True, False])
def test_a_metadata_request_naming_a_missing_topic_creates_it_on_the_embedded_broker(
    services, allow
):
    """Why the topic is listed first: a producer's metadata request for one topic creates it,
    even when the request says ``allow_auto_topic_creation=False``; listing all topics does
    not."""
    from kafka import KafkaProducer

    bootstrap, topic = services.broker.bootstrap, f"named-by-a-producer-{allow}"
    assert topic not in listed_topics(bootstrap)  # the listing created nothing
    producer = KafkaProducer(bootstrap_servers=bootstrap, allow_auto_create_topics=allow)
    try:
        producer.partitions_for(topic)
    finally:
        producer.close()
    assert topic in listed_topics(bootstrap)


def test_the_early_producer_refuses_a_missing_topic_and_creates_none(services):
    """Before: the early producer asked for the topic's partitions at once, and the broker made
    the topic; the upload then sent to a topic no worker reads."""
    from pipeline.upload import EarlyProducer

    bootstrap, topic = services.broker.bootstrap, "dpstream.nobody.reports"
    early = EarlyProducer(bootstrap, topic)
    with pytest.raises(TopicMissing, match="'dpstream.nobody.reports' does not exist"):
        early.get()
    early.close()
    assert topic not in listed_topics(bootstrap)


def test_the_early_producer_of_an_existing_topic_asks_the_broker_nothing_more(
    services, monkeypatch
):
    """The producer's first metadata request named no topic and the broker's answer lists the
    topic: it exists, and no second request is made. Before: a second one (for all topics) was
    always asked for, and kafka-python holds a metadata request back until its refresh backoff
    (``retry_backoff_ms``, 100 ms) has passed since the first, so the producer was ready ~110 ms
    after it was started: after the check of 10^6 reports (~90 ms), which then waited for it."""
    from kafka.cluster import ClusterMetadata

    from pipeline.stream.kafka.topics import ensure_topics, topic_names
    from pipeline.upload import EarlyProducer

    dep = parse_config(dict(_config(services), name="has-topics"))
    ensure_topics(services.broker.bootstrap, dep)
    topic = topic_names(dep)["reports"]
    asked: list[bool] = []
    update = ClusterMetadata.request_update

    def counted(self):
        asked.append(self.need_all_topic_metadata)
        return update(self)

    monkeypatch.setattr(ClusterMetadata, "request_update", counted)
    early = EarlyProducer(services.broker.bootstrap, topic)
    producer = early.get()
    try:
        assert producer.partitions_for(topic) == {0, 1}
    finally:
        producer.close()
    assert asked == []


def test_require_topic_refuses_a_missing_topic_and_creates_none(services):
    """The check of `produce --simulate`, `--dry-run` and `ReportSender.check_topic` (and of the
    early producer on a kafka-python without the internals it lists topics with)."""
    from pipeline.producer import require_topic

    bootstrap = services.broker.bootstrap
    with pytest.raises(TopicMissing, match="'dpstream.nobody2.reports' does not exist.*'nobody2'"):
        require_topic(bootstrap, "dpstream.nobody2.reports", "nobody2")
    assert "dpstream.nobody2.reports" not in listed_topics(bootstrap)


def test_upload_file_to_a_missing_topic_sends_nothing_and_makes_no_topic(services, tmp_path):
    from pipeline.stream.kafka.topics import topic_names
    from pipeline.upload import upload_file

    dep = parse_config(dict(_config(services), name="no-topics"))
    topic = topic_names(dep)["reports"]
    with pytest.raises(TopicMissing, match="does not exist"):
        upload_file(_file(tmp_path), dep, services.broker.bootstrap)
    assert topic not in listed_topics(services.broker.bootstrap)


def test_the_early_producer_closed_before_it_is_made_waits_for_nothing():
    """A refused file closes the producer at once, even when the broker does not answer (the
    thread closes what it makes, later)."""
    from pipeline.upload import EarlyProducer

    early = EarlyProducer("127.0.0.1:9", "dpstream.x.reports")  # nothing listens on port 9
    started = time.monotonic()
    early.close()
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("mode", ["file", "dry-run", "simulate"])
def test_produce_to_a_missing_reports_topic_sends_nothing_and_makes_no_topic(
    services, tmp_path, mode
):
    """Before: `dpstream produce` to a deployment whose topics did not exist (never started) read
    the workers' counts from the reports topic, which made the broker create it, and then sent
    the file to it: "sent 50 reports for step 1 (all acknowledged)", exit 0, to a topic no
    worker reads. Now the topic is checked first (a file's by the producer made while the file
    is checked) and no topic is made: the deployment the broker does not have is said as the
    analysts' commands say it, exit 2 (tests/test_produce_missing_deployment.py)."""
    name = f"never-up-{mode}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(_config(services), name=name)))
    what = {
        "file": ["--parquet", _file(tmp_path)],
        "dry-run": ["--parquet", _file(tmp_path), "--dry-run"],
        "simulate": ["--simulate"],
    }[mode]
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--config", str(path), *what,
         "--no-wait", "--wait", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == EXIT_CONFIG, (run.stdout, run.stderr)
    assert f'no deployment "{name}" on broker' in run.stderr, run.stderr
    assert not {t for t in listed_topics(services.broker.bootstrap) if name in t}


def test_produce_with_a_broker_that_does_not_answer_says_so_at_once(tmp_path):
    """The producer made during the check waits for its bootstrap's timeout (30 s) when nothing
    answers; produce does not wait for it: one line, exit 1, as before the early producer."""
    from pipeline.stream.local.embedded import free_port

    dead = f"127.0.0.1:{free_port()}"
    config = dict(_config(broker=dead, redis=f"redis://{dead}/0"), name="dead-broker")
    path = tmp_path / "dead.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--config", str(path),
         "--parquet", _file(tmp_path), "--no-wait"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == EXIT_RUNTIME, (run.stdout, run.stderr)
    assert "broker unreachable" in run.stderr and "Connection refused" in run.stderr, run.stderr
    assert time.monotonic() - started < 15
