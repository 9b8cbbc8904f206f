"""`dpstream produce --dry-run` counts exactly the reports the workers would dead-letter as
duplicate, from what is on the reports log (docs/own-data.md, "Dry run"): reports the workers have
handled and reports they have not yet, sent to the owning partition or not; a report the workers
rejected as too far ahead holds nothing; a closed step's reports are counted as late; a forged or
unsigned close marker moves no window (checked with the keys in the deployment descriptor, as the
workers check it), and a close signed with a key since rotated out still counts (`dpstream up`:
embedded broker, Redis, a worker and the releaser)."""

from __future__ import annotations

import json
import os
import signal

import yaml

from pipeline.connections import kafka_security
from support.cli import N, deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture
from support.report_log import report_csv, worker_pids


def _send_raw(broker: str, step: int, users, partition: int) -> None:
    """Single JSON reports, all to one partition (another producer's: not the owner of half)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker, **kafka_security())
    for i in users:
        report = {"user": f"u{i}", "step": step, "values": {"poverty": i % 2}}
        producer.send("dpstream.cli-test.reports", json.dumps(report).encode(),
                      partition=partition)
    producer.flush()
    producer.close()


def test_the_dry_run_counts_duplicates_exactly(deployment, tmp_path):  # noqa: F811
    """Before: a dry run knew only the workers' counts per step and said "at least
    max(0, sending + held - n)" duplicates: a file of 400 users of whom 200 were held passed
    (at least 0, exit 0), and its send lost 200 reports as duplicate. Now each count is exact."""
    path, env = deployment
    config = yaml.safe_load(path.read_text())
    config["steps"] = {"max_ahead": 0}  # only the open step: step 2 is too far ahead until 1 closes
    path.write_text(yaml.safe_dump(config))
    cfg = ["--config", str(path)]

    def dry(name: str, step: int, users, wait: str = "10"):
        return dpstream("produce", *cfg, "--csv", report_csv(tmp_path / name, step, users), "--dry-run",
                        "--wait", wait, env=env, check=False)

    with running(path, env, tmp_path) as broker:
        dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "a.csv", 1, range(400)), env=env)
        half = dry("b.csv", 1, range(200, 600))  # users 200..399 are held
        assert half.returncode == 5, (half.stdout, half.stderr)
        assert "step 1: 200 of the 400 reports are of users the workers already hold" in \
            half.stdout, half.stdout
        assert "dry run: 200 of the 400 reports would be rejected as duplicate" in half.stderr
        assert "exact for the" in half.stderr

        # reports on the log that the (stopped) worker has not handled, half of them on a
        # partition that does not own their user, count too
        workers = worker_pids(tmp_path)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            _send_raw(broker, 1, range(400, 450), partition=0)
            pending = dry("c.csv", 1, range(200, 600), wait="1")
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        assert pending.returncode == 5, (pending.stdout, pending.stderr)
        assert "dry run: 250 of the 400 reports would be rejected as duplicate" in pending.stderr

        # step 2 while step 1 is open is too far ahead (max_ahead 0): dead-lettered, holds nothing
        _send_raw(broker, 2, range(100), partition=1)
        dpstream("close", *cfg, "--step", "1", env=env)
        clean = dry("d.csv", 2, range(N))
        assert clean.returncode == 0, (clean.stdout, clean.stderr)
        assert "log's start" not in clean.stdout  # read from step 1's close marker
        assert f"dry run: {N} reports for step 2 pass the workers' checks, none a duplicate" in \
            clean.stdout, clean.stdout
        dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "e.csv", 2, range(100)), env=env)
        some = dry("f.csv", 2, range(N))
        assert f"step 2: 100 of the {N} reports" in some.stdout, (some.stdout, some.stderr)

        late = dry("g.csv", 1, range(N))
        assert late.returncode == 3, (late.stdout, late.stderr)
        assert "step 1 is closed" in late.stderr and f"the file's {N} reports of step 1" in \
            late.stderr


def _forge_markers(broker: str, step: int) -> None:
    """Close markers of ``step`` anyone with the producer credential can write: one with a
    signature that does not verify (partition 0), one without a signature (partition 1)."""
    import base64

    from kafka import KafkaProducer

    from pipeline.stream.kafka.messages import CONTROL_HEADER

    bad = base64.b64encode(bytes(64)).decode()
    values = {0: {"step": step, "closed_at": 1, "action": "close", "signature": bad},
              1: {"step": step, "closed_at": 1, "action": "close"}}
    producer = KafkaProducer(bootstrap_servers=broker, **kafka_security())
    for partition, value in values.items():
        producer.send("dpstream.cli-test.reports", json.dumps(value).encode(),
                      partition=partition, headers=[(CONTROL_HEADER, b"close")]).get(timeout=30)
    producer.close()


def _wait_for_published_key(broker: str, pem: str, timeout: float = 60.0) -> None:
    """Until the releaser has published the descriptor carrying the curator key ``pem``."""
    import time

    from pipeline import descriptor

    deadline = time.monotonic() + timeout
    while True:
        published = descriptor.published(broker, "dpstream.cli-test.deployment")
        if published and published.get("close_keys", {}).get("close") == pem:
            return
        assert time.monotonic() < deadline, "the releaser published no descriptor with the key"
        time.sleep(0.3)


def test_a_forged_close_marker_moves_no_window_of_the_dry_run(deployment, tmp_path):  # noqa: F811
    """Before: the dry run took any close marker of a closed step as its close, unsigned or forged.
    Forged step-1 markers written before the real close made it count step-3 reports sent in
    between as held (step 3 in the window 2..3), though the workers, for whom step 1 was still
    open, had dead-lettered them as too far ahead: 200 duplicates foreseen, 50 real. Now it checks
    each marker with the keys the releaser publishes in the deployment descriptor, as the workers
    do, and its count is what the send then loses as duplicate."""
    path, env = deployment
    config = yaml.safe_load(path.read_text())
    config["steps"] = {"max_ahead": 1}  # steps 1 and 2 open; 3 too far ahead until 1 closes
    path.write_text(yaml.safe_dump(config))
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path) as broker:
        _forge_markers(broker, 1)
        _send_raw(broker, 3, range(100), partition=0)  # after the forged markers: future_step
        _send_raw(broker, 3, range(100, 200), partition=1)
        dpstream("close", *cfg, "--step", "1", env=env)
        dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "held.csv", 3, range(50)), env=env)
        control = tmp_path / "home" / "cli-test" / "control"
        _wait_for_published_key(broker, (control / "curator.pub").read_text())

        sending = report_csv(tmp_path / "step3.csv", 3, range(200))
        dry = dpstream("produce", *cfg, "--csv", sending, "--dry-run", env=env, check=False)
        assert dry.returncode == 5, (dry.stdout, dry.stderr)
        assert "step 3: 50 of the 200 reports are of users the workers already hold" in \
            dry.stdout, dry.stdout
        assert "not checked" not in dry.stderr, dry.stderr

        sent = dpstream("produce", *cfg, "--csv", sending, env=env, check=False)
        assert "150 accepted, 50 rejected (duplicate 50)" in sent.stdout, (sent.stdout,
                                                                          sent.stderr)
        letters = dpstream("dead-letters", *cfg, env=env).stdout
        assert "unauthenticated" in letters and "future_step" in letters, letters


def test_a_close_signed_with_a_rotated_out_key_still_counts(deployment, tmp_path):  # noqa: F811
    """After the curator key is rotated (docs/security.md, "Rotating a key"), step 1's marker on
    the log verifies with no published key; the worker recorded it as step 1's close, so the dry
    run still reads step-3 reports sent after it as held (else it would foresee 0 duplicates of
    the 50 the send loses)."""
    from support.up import wait_released

    path, env = deployment
    config = yaml.safe_load(path.read_text())
    config["steps"] = {"max_ahead": 1}  # read from the log's start: step 1's marker is read
    path.write_text(yaml.safe_dump(config))
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path):
        dpstream("close", *cfg, "--step", "1", env=env)
        dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "held.csv", 3, range(50)), env=env)
        wait_released(path, env, 1)
    control = tmp_path / "home" / "cli-test" / "control"
    old = (control / "curator.pub").read_bytes()
    for name in ("curator.key", "curator.pub"):
        (control / name).unlink()
    with running(path, env, tmp_path) as broker:
        new = (control / "curator.pub").read_text()
        assert new != old.decode()  # a new pair
        _wait_for_published_key(broker, new)
        dry = dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "s.csv", 3, range(200)),
                       "--dry-run", env=env, check=False)
    assert dry.returncode == 5, (dry.stdout, dry.stderr)
    assert "step 3: 50 of the 200 reports are of users the workers already hold" in dry.stdout, \
        (dry.stdout, dry.stderr)
    assert "not checked" not in dry.stderr, dry.stderr
