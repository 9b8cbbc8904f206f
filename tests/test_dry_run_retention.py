"""`dpstream produce --dry-run` on the durable log after its retention deleted the close marker the
count's windows start from (docs/own-data.md, "Dry run"): the last step closed before the first
record left is the one the workers' history records, so reports and an upload sent after that
close still count (`dpstream up`: embedded durable broker with its retention, Redis, a worker
and the releaser)."""

from __future__ import annotations

import time

from support.cli import deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture
from support.up import wait_released
from test_held_uploads import TOPIC, _ahead, _dry, _Upload, _workers_hold
from test_produce_dry_run import _csv


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

    path, env, cfg = _ahead(deployment, 1)
    with running(path, env, tmp_path) as broker:
        from kafka import TopicPartition

        dpstream("produce", *cfg, "--csv", _csv(tmp_path / "one.csv", 1, range(800)), env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        after_close = log_ends(broker, [TopicPartition(TOPIC, p) for p in range(2)])
        wait_released(path, env, 1)
        time.sleep(6)  # a retention round samples the checkpoints at step 1's close
        dpstream("produce", *cfg, "--csv", _csv(tmp_path / "three.csv", 3, range(100)), env=env)
        upload = _Upload(broker, 3, range(100, 140))
        dpstream("close", *cfg, "--step", "2", env=env)
        wait_released(path, env, 2)
        deadline = time.monotonic() + 60
        while any(_first_offsets(broker)[tp.partition] < end for tp, end in after_close.items()):
            assert time.monotonic() < deadline, "the retention deleted nothing"
            time.sleep(1)
        upload.end(commit=True)
        count, out = _dry(cfg, env, tmp_path / "a.csv", 3, range(200))
        assert count == 140, out
        assert "exact for" in out, out
        assert _workers_hold(cfg, env, 3) == 140
