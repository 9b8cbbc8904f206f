"""Held uploads on real processes (`dpstream up`: embedded broker, Redis, one worker, the
releaser): an upload's messages count nowhere until its commit records, also when the worker is
killed -9 in between; an aborted upload never counts; an upload never ended is dead-lettered
``uncommitted`` at the second close."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import orjson
from kafka import KafkaProducer

from pipeline.connections import kafka_security
from pipeline.stream.ingest.uploads import end_record, upload_headers
from pipeline.stream.local.broker_tls import BROKER_TLS_ENV
from support.cli import N, deployment, dpstream  # noqa: F401 - `deployment` is a fixture
from support.up import status_json, up, wait_released

TOPIC = "dpstream.cli-test.reports"


def _reported(path, env, step: int) -> int:
    return status_json(path, env)["intake"]["open"].get(str(step), {"reported": 0})["reported"]


def _wait_reported(path, env, step: int, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := _reported(path, env, step)) != n:
        assert time.monotonic() < deadline, f"step {step}: {got} reported, not {n}"
        time.sleep(0.3)


def _producer(run, monkeypatch) -> KafkaProducer:
    broker = run.wait_for(r"dpstream up: broker (\S+?),").group(1)
    record = json.loads((run.home / "cli-test.json").read_text())
    if record.get("broker_tls"):
        monkeypatch.setenv(BROKER_TLS_ENV, record["broker_tls"])
    return KafkaProducer(bootstrap_servers=broker, **kafka_security())


def _send_upload(producer, upload: str, users, step: int) -> dict[int, int]:
    """One JSON report per message, alternately on the two partitions (a user owned by the other
    partition is forwarded once committed); returns messages per partition."""
    counts = {0: 0, 1: 0}
    for i, u in enumerate(users):
        value = orjson.dumps({"user": f"u{u}", "step": step, "values": {"poverty": u % 2}})
        producer.send(TOPIC, value=value, partition=i % 2, headers=upload_headers(upload))
        counts[i % 2] += 1
    producer.flush()
    return counts


def _end(producer, upload: str, counts: dict[int, int], commit: bool) -> None:
    for partition, n in counts.items():
        value, headers = end_record(upload, n, commit)
        producer.send(TOPIC, value=value, partition=partition, headers=headers)
    producer.flush()


def test_an_upload_counts_at_its_commit_even_across_a_killed_worker(deployment, tmp_path,
                                                                     monkeypatch):
    path, env = deployment
    cfg = ["--config", str(path)]
    with up(path, env, tmp_path, workers=1) as run:
        producer = _producer(run, monkeypatch)
        held = _send_upload(producer, "1" * 32, range(0, 300), 1)
        aborted = _send_upload(producer, "2" * 32, range(300, 400), 1)
        _end(producer, "2" * 32, aborted, commit=False)
        # plain reports after them in both partitions: once they count, the worker has handled
        # (and held) the upload messages before them
        for i, u in enumerate(range(400, 410)):
            value = orjson.dumps({"user": f"u{u}", "step": 1, "values": {"poverty": 1}})
            producer.send(TOPIC, value=value, partition=i % 2)
        producer.flush()
        _wait_reported(path, env, 1, 10)
        time.sleep(1.0)
        assert _reported(path, env, 1) == 10  # neither upload counts
        held_now = status_json(path, env)["intake"]["held_uploads"]
        assert held_now == {"1" * 32: {"messages": 300, "closes": 0}}, held_now
        text = dpstream("status", *cfg, env=env).stdout
        assert f"upload {'1' * 32}: 300 message(s) held, not committed yet" in text, text
        worker = next(pid for name, pid in run.started().items() if name.startswith("worker"))
        os.kill(worker, signal.SIGKILL)
        run.wait_for(r"restarted worker\S* \(pid \d+\)")
        _end(producer, "1" * 32, held, commit=True)
        _wait_reported(path, env, 1, 310)
        time.sleep(1.0)
        assert _reported(path, env, 1) == 310  # the aborted one still does not
        assert status_json(path, env)["intake"]["held_uploads"] == {}
        # an upload never ended: held through the close of step 1, dead-lettered at step 2's
        never = _send_upload(producer, "3" * 32, range(500, 520), 2)
        deadline = time.monotonic() + 60
        while status_json(path, env)["intake"]["held_uploads"].get("3" * 32, {}).get("messages") \
                != 20:
            assert time.monotonic() < deadline, status_json(path, env)["intake"]
            time.sleep(0.3)
        closing = dpstream("close", *cfg, "--step", "1", env=env, timeout=180)
        assert f"WARNING: upload {'3' * 32}: 20 message(s) held by the workers, not committed" in \
            closing.stderr, closing.stderr
        wait_released(path, env, 1, timeout=120)
        assert _reported(path, env, 2) == 0
        dpstream("close", *cfg, "--step", "2", env=env, timeout=180)
        wait_released(path, env, 2, timeout=120)
        letters = dpstream("dead-letters", *cfg, env=env).stdout
        assert re.search(rf"uncommitted\s+{sum(never.values())}\b", letters), letters
        producer.close()
