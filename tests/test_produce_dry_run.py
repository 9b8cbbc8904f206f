"""`dpstream produce --dry-run` counts exactly the reports the workers would dead-letter as
duplicate, from what is on the reports log (docs/own-data.md, "Dry run"): reports the workers have
handled and reports they have not yet, sent to the owning partition or not; a report the workers
rejected as too far ahead holds nothing; a closed step's reports are counted as late (`dpstream
up`: embedded broker, Redis, a worker and the releaser)."""

from __future__ import annotations

import csv
import json
import os
import signal

import yaml

from pipeline.connections import kafka_security
from support.cli import N, deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture


def _csv(path, step: int, users) -> str:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "step", "poverty"])
        w.writerows([f"u{i}", step, i % 2] for i in users)
    return str(path)


def _worker_pids(tmp_path) -> list[int]:
    record = json.loads((tmp_path / "home" / "cli-test.json").read_text())
    return [p["pid"] for name, p in record["processes"].items() if name.startswith("worker")]


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
        return dpstream("produce", *cfg, "--csv", _csv(tmp_path / name, step, users), "--dry-run",
                        "--wait", wait, env=env, check=False)

    with running(path, env, tmp_path) as broker:
        dpstream("produce", *cfg, "--csv", _csv(tmp_path / "a.csv", 1, range(400)), env=env)
        half = dry("b.csv", 1, range(200, 600))  # users 200..399 are held
        assert half.returncode == 5, (half.stdout, half.stderr)
        assert "step 1: 200 of the 400 reports are of users the workers already hold" in \
            half.stdout, half.stdout
        assert "dry run: 200 of the 400 reports would be rejected as duplicate" in half.stderr
        assert "exact for the" in half.stderr

        # reports on the log that the (stopped) worker has not handled, half of them on a
        # partition that does not own their user, count too
        workers = _worker_pids(tmp_path)
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
        dpstream("produce", *cfg, "--csv", _csv(tmp_path / "e.csv", 2, range(100)), env=env)
        some = dry("f.csv", 2, range(N))
        assert f"step 2: 100 of the {N} reports" in some.stdout, (some.stdout, some.stderr)

        late = dry("g.csv", 1, range(N))
        assert late.returncode == 3, (late.stdout, late.stderr)
        assert "step 1 is closed" in late.stderr and f"the file's {N} reports of step 1" in \
            late.stderr
