"""Reports written straight to a running deployment's reports log (`support.cli`'s deployment:
two partitions), and what the workers and the dry run say of them: shared by the dry-run and
held-upload tests."""

from __future__ import annotations

import csv
import json
import uuid

import orjson
import yaml

from pipeline.connections import kafka_security
from support.cli import dpstream


def report_csv(path, step: int, users) -> str:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "step", "poverty"])
        w.writerows([f"u{i}", step, i % 2] for i in users)
    return str(path)


def worker_pids(tmp_path) -> list[int]:
    record = json.loads((tmp_path / "home" / "cli-test.json").read_text())
    return [p["pid"] for name, p in record["processes"].items() if name.startswith("worker")]


TOPIC = "dpstream.cli-test.reports"
# the broker's log in memory: the durable log's retention, which may delete an upload's messages
# sent before a close, is not what these tests are about (test_dry_run_retention.py)
IN_MEMORY = ("--ephemeral",)
PARTITIONS = 2


def owned_by_partition(users) -> dict[int, list[int]]:
    """The users by the reports partition owning them (as an upload sends them)."""
    from pipeline.stream.ingest.murmur import partitions_of

    users = list(users)
    owners = partitions_of([f"u{i}" for i in users], PARTITIONS)
    return {p: [u for u, o in zip(users, owners, strict=True) if o == p] for p in range(PARTITIONS)}


class RawUpload:
    """One upload's records on the reports log: columnar batch messages with the upload header,
    two per partition, then (when asked) an end record per partition."""

    def __init__(self, broker: str, step: int, users, partition: int | None = None):
        """``partition``: all to this one (another producer's), not each user's owner."""
        from kafka import KafkaProducer

        from pipeline.stream.ingest.uploads import upload_headers

        self.id = uuid.uuid4().hex
        self.producer = KafkaProducer(bootstrap_servers=broker, **kafka_security())
        self.sent: dict[int, int] = {}
        by_partition = owned_by_partition(users) if partition is None else {partition: list(users)}
        for p, owned in by_partition.items():
            for part in (owned[: len(owned) // 2], owned[len(owned) // 2 :]):
                columns = {"user": [f"u{i}" for i in part], "step": step,
                           "poverty": [i % 2 for i in part]}
                self.producer.send(TOPIC, orjson.dumps({"columns": columns}), partition=p,
                                   headers=upload_headers(self.id)).get(timeout=30)
                self.sent[p] = self.sent.get(p, 0) + 1

    def end(self, commit: bool = True, stated: int = 0) -> None:
        """The end records; ``stated``: added to the count each states."""
        from pipeline.stream.ingest.uploads import end_record

        for p, n in self.sent.items():
            value, headers = end_record(self.id, n + stated, commit)
            self.producer.send(TOPIC, value, partition=p, headers=headers).get(timeout=30)
        self.producer.close()


def workers_hold(cfg, env, step: int) -> int:
    """Users the workers count an accepted report of for open step ``step`` (`dpstream status`,
    once they have handled the log)."""
    status = json.loads(dpstream("status", *cfg, "--json", "--wait", "60", env=env).stdout)
    assert not status["intake"]["unhandled_records"], status["intake"]
    return status["intake"]["open"][str(step)]["reported"]


def with_max_ahead(deployment, max_ahead: int) -> tuple[object, dict, list[str]]:  # noqa: F811
    """(path, env, command-line config) of the deployment with ``steps.max_ahead``."""
    path, env = deployment
    config = yaml.safe_load(path.read_text())
    config["steps"] = {"max_ahead": max_ahead}
    path.write_text(yaml.safe_dump(config))
    return path, env, ["--config", str(path)]


def dry_run(cfg, env, path, step: int, users, wait: str = "10") -> tuple[int, str]:
    """(duplicates foreseen, output) of a dry run of ``users``' reports of ``step``."""
    run = dpstream("produce", *cfg, "--csv", report_csv(path, step, users), "--dry-run", "--wait", wait,
                   env=env, check=False)
    assert run.returncode in (0, 5), (run.stdout, run.stderr)
    if run.returncode == 0:
        return 0, run.stdout
    return int(run.stderr.split("dry run: ", 1)[1].split(" of ", 1)[0].replace(",", "")), \
        run.stdout + run.stderr
