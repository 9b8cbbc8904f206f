"""Uploads of report files as batch messages, and corrections of an open step, through the real
stream.

Real embedded broker and Redis, real worker and releaser processes, ``dpstream produce`` as a
subprocess. The reference is the library run in batch on the panel the workers should hold: a row
counted twice or lost, a correction ignored, or one applied twice changes the synthetic columns.

What breaks these tests: an upload that sends per-report messages or to partitions that do not own
the users, a Parquet/JSONL/CSV reader that drops, repeats or misreads rows; a worker that keeps the
first report of a (user, step) when a correction follows, applies a correction to a closed step, or
after a kill -9 and a replay of its log from the checkpoint ends in another state.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import orjson
import pytest

from pipeline.config import load_config
from pipeline.stream.ingest.corrections import REPLACE_HEADER
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.ingest.uploads import UPLOAD_END_HEADER
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.state.store import StateStore
from support.stream_runs import (check_outputs, panel_data, read_dead_letters, run_steps,
                                 wait_accepted, write_config)

N, T = 1200, 6

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def dpstream(*args, home, check=True):
    env = dict(os.environ, DPSTREAM_HOME=str(home), PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"dpstream {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}"
        )
    return proc


def write_reports(path, users: list[str], step: int, values: np.ndarray):
    """``users``' reports of ``step`` in the file's format (by suffix), as a producer would write
    them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".csv":
        path.write_text(
            "user,step,pov\n" + "".join(f"{u},{step},{int(v)}\n" for u, v in zip(users, values))
        )
    elif path.suffix == ".jsonl":  # booleans, as a JSON export of a boolean column writes them
        path.write_bytes(
            b"".join(
                orjson.dumps({"user": u, "step": step, "values": {"pov": bool(v)}}) + b"\n"
                for u, v in zip(users, values)
            )
        )
    else:
        pq.write_table(
            pa.table({"user": users, "step": [step] * len(users), "pov": values.astype(np.int8)}),
            path,
        )
    return str(path)


def reports_log(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, dict, bytes]]:
    """Every record of the reports topic: (partition, headers, value)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    out = []
    while any(consumer.position(tp) < ends[tp] for tp in tps):
        for tp, msgs in consumer.poll(timeout_ms=500).items():
            out += [(tp.partition, dict(m.headers), m.value) for m in msgs]
    consumer.close()
    return out


def send_correction(
    bootstrap: str, topic: str, user: str, step: int, value: int, partition: int
) -> None:
    """One correction as any producer may send it: a single report with the header, to
    ``partition``."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(
        topic,
        value=orjson.dumps({"user": user, "step": step, "values": {"pov": value}}),
        partition=partition,
        headers=[(REPLACE_HEADER, b"1")],
    ).get(timeout=30)
    producer.close()


def finish(drv, cluster, services, dep, X, expected, steps) -> None:
    """Send and close the remaining ``steps`` of ``X``; the whole release must equal the batch run
    on
    ``expected`` (the panel with the corrections)."""
    run_steps(drv, X, steps, cluster)
    drv.shutdown()
    check_outputs(
        dep,
        expected,
        drv.panels,
        StateStore.from_url(services.redis.url, dep.name),
        drv.manifests_seen,
    )


def test_csv_jsonl_and_parquet_files_go_as_batches_to_the_owners_and_every_row_counts_once(
    services, tmp_path
):
    path = write_config(tmp_path, services, "upload-formats", n=N)
    dep, X = load_config(path), panel_data(seed=5)
    roster = Roster.from_config(dep.roster)
    order = np.random.default_rng(2).permutation(N)  # the files list the users in any order
    users = [roster.ids[i] for i in order]
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        for t, kind in zip(range(1, T + 1), ["csv", "jsonl", "parquet", "csv", "jsonl", "parquet"]):
            file = write_reports(tmp_path / f"step{t}.{kind}", users, t, X[order, t - 1])
            out = dpstream(
                "produce", "--config", path, f"--{kind}", file, home=tmp_path / "home"
            ).stdout
            assert f"sent {N} reports for step {t} (all acknowledged)" in out
            drv.close(t)
        drv.shutdown()
        cluster.check_alive()
        # every row once: the release equals the batch run on the panel
        check_outputs(
            dep,
            X,
            drv.panels,
            StateStore.from_url(services.redis.url, dep.name),
            drv.manifests_seen,
        )
        owners = roster.owners(dep.topics.partitions)
        records = [
            (p, h, v)
            for p, h, v in reports_log(cluster.broker, cluster.names["reports"], 2)
            if "dpstream-control" not in h
        ]
    # one columnar message per partition and step (1,200 reports fit one), each to its users'
    # owner, then the upload's commit record on that partition
    batches = [(p, orjson.loads(v)) for p, h, v in records if UPLOAD_END_HEADER not in h]
    commits = [p for p, h, _ in records if h.get(UPLOAD_END_HEADER) == b"commit"]
    assert len(batches) == dep.topics.partitions * T
    assert sorted(commits) == sorted(p for p, _ in batches)
    for p, msg in batches:
        rows = roster.rows_of_ids(msg["columns"]["user"])
        assert (owners[rows] == p).all()
    assert sum(len(msg["columns"]["user"]) for _, msg in batches) == N * T


def test_a_correction_replaces_the_report_of_an_open_step_and_is_late_after_the_close(
    services, tmp_path
):
    path = write_config(tmp_path, services, "upload-corrections", n=N)
    dep, X = load_config(path), panel_data(seed=6)
    roster = Roster.from_config(dep.roster)
    owners = roster.owners(dep.topics.partitions)
    home = tmp_path / "home"
    fixed = np.random.default_rng(3).choice(N, size=150, replace=False)
    corrected = X.copy()
    corrected[fixed, 0] = 1 - X[fixed, 0]
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        topic = cluster.names["reports"]
        dpstream(
            "produce",
            "--config",
            path,
            "--csv",
            write_reports(tmp_path / "s1.csv", roster.ids, 1, X[:, 0]),
            home=home,
        )
        out = dpstream(
            "produce",
            "--config",
            path,
            "--replace",
            "--parquet",
            write_reports(
                tmp_path / "fix.parquet",
                [roster.ids[i] for i in fixed[:-1]],
                1,
                corrected[fixed[:-1], 0],
            ),
            home=home,
        ).stdout
        assert f"sent {len(fixed) - 1} corrections for step 1 (all acknowledged)" in out
        # the last one by another producer, to the partition that does not own the user (forwarded)
        last = int(fixed[-1])
        send_correction(
            cluster.broker,
            topic,
            roster.ids[last],
            1,
            int(corrected[last, 0]),
            1 - int(owners[last]),
        )
        # a report without the header after a correction stays a duplicate: the correction holds
        drv.producer.send_raw(
            orjson.dumps({"user": roster.ids[last], "step": 1, "values": {"pov": int(X[last, 0])}}),
            partition=int(owners[last]),
        )
        time.sleep(2.0)  # the forwarded correction reaches the owner before the close marker
        drv.close(1)
        late_user = int(fixed[0])
        send_correction(
            cluster.broker,
            topic,
            roster.ids[late_user],
            1,
            int(X[late_user, 0]),
            int(owners[late_user]),
        )
        finish(drv, cluster, services, dep, X, corrected, range(2, T + 1))
        letters = read_dead_letters(cluster.broker, cluster.names["dead-letter"], expect=2)
    reasons = sorted(h["dpstream-reason"].decode() for h, _ in letters)
    assert reasons == ["duplicate", "late"], reasons
    late = next(orjson.loads(v) for h, v in letters if h["dpstream-reason"] == b"late")
    assert late["user"] == roster.ids[late_user]


def test_replay_after_a_worker_kill9_ends_in_the_same_corrected_state(services, tmp_path):
    """Step 2's reports and a first round of corrections are applied, then the worker is killed -9
    (its checkpoint is step 1's close); a second round corrects some of the same users again. The
    restarted worker replays step 2's log from the checkpoint: the release holds the last
    corrections.
    """
    path = write_config(tmp_path, services, "upload-corrections-kill", n=N)
    dep, X = load_config(path), panel_data(seed=7)
    roster = Roster.from_config(dep.roster)
    home = tmp_path / "home"
    rng = np.random.default_rng(4)
    first = rng.choice(N, size=200, replace=False)
    second = np.concatenate(
        [first[:60], rng.choice(np.setdiff1d(np.arange(N), first), size=40, replace=False)]
    )
    final = X.copy()
    final[first, 1] = 1 - X[first, 1]
    final[second, 1] = rng.integers(0, 2, second.size)
    once = final.copy()
    once[first, 1] = 1 - X[first, 1]
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs", metrics=True) as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        drv.producer.send_step(1, {"pov": X[:, 0]})
        drv.close(1)
        drv.producer.send_step(2, {"pov": X[:, 1]})
        dpstream(
            "produce",
            "--config",
            path,
            "--replace",
            "--jsonl",
            write_reports(
                tmp_path / "fix1.jsonl", [roster.ids[i] for i in first], 2, once[first, 1]
            ),
            home=home,
        )
        wait_accepted(cluster, "worker-0", 2 * N + first.size)
        time.sleep(
            3.5
        )  # > the commit interval: the group's committed offsets are past the corrections
        cluster.kill("worker-0")
        dpstream(  # the worker is down: no verdict can come until it is restarted below
            "produce",
            "--config",
            path,
            "--replace",
            "--no-wait",
            "--csv",
            write_reports(
                tmp_path / "fix2.csv", [roster.ids[i] for i in second], 2, final[second, 1]
            ),
            home=home,
        )
        cluster.spawn("worker", "worker-0")
        drv.close(2)
        finish(drv, cluster, services, dep, X, final, range(3, T + 1))
