"""`dpstream produce` of a file in one pass on real processes (`dpstream up`: embedded broker,
Redis, a worker, the releaser): a bad report in a later chunk, or Ctrl-C mid-send, comes after
messages were sent; they are withdrawn by abort records, `produce` says nothing of the file was
accepted (exit 2, 130), and the workers take nothing of it — the same file fixed is then accepted
whole, with no report a duplicate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import yaml
from kafka import KafkaConsumer, TopicPartition

from pipeline.connections import kafka_security
from pipeline.stream.ingest.uploads import end_of, upload_of
from support.cli import N, deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture

TOPIC = "dpstream.cli-test.reports"


def _csv(path, step: int, users, extra: str = "") -> str:
    path.write_text("user,step,poverty\n" + "".join(f"u{i},{step},{i % 2}\n" for i in users)
                    + extra)
    return str(path)


def _log(broker: str) -> list:
    """Every record of the reports topic now."""
    consumer = KafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False,
                             **kafka_security())
    try:
        parts = [TopicPartition(TOPIC, p) for p in sorted(consumer.partitions_for_topic(TOPIC))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        records: list = []
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for batch in consumer.poll(timeout_ms=500).values():
                records += batch
        return records
    finally:
        consumer.close()


def _ends_of_uploads(records) -> dict[str, set[str]]:
    """Upload id -> its end records' kinds on the log."""
    out: dict[str, set[str]] = {}
    for r in records:
        upload = upload_of(r.headers)
        if upload:
            out.setdefault(upload, set())
            if end_of(r.headers):
                out[upload].add(end_of(r.headers))
    return out


def _status(path, env) -> dict:
    return json.loads(dpstream("status", "--config", str(path), "--json", env=env).stdout)


def _handled(path, env, timeout: float = 60.0) -> dict:
    """The workers' intake once they have handled every record on the reports log."""
    deadline = time.monotonic() + timeout
    while True:
        intake = _status(path, env)["intake"]
        if not intake["unhandled_records"] or time.monotonic() > deadline:
            return intake
        time.sleep(0.3)


def _reported(intake: dict, step: int) -> int:
    return intake["open"].get(str(step), {"reported": 0})["reported"]


def test_a_bad_report_in_a_later_chunk_is_sent_then_aborted_and_nothing_accepted(
        deployment, tmp_path):  # noqa: F811
    """Before: the whole file was checked before anything was sent (two reads of it). Now the
    chunks before the bad line are on the log when it is found: `produce` exits 2 naming the line
    and saying the upload was aborted, the log holds the upload's messages and its abort records
    (no commit), and the workers hold nothing of it: the fixed file is then accepted whole."""
    path, env = deployment
    env = dict(env, DPSTREAM_UPLOAD_CHUNK_ROWS="64")
    cfg = ["--config", str(path)]
    bad = tmp_path / "bad.csv"
    _csv(bad, 1, range(N), extra="u3,1,0\n")  # u3 again, on the last line
    with running(path, env, tmp_path) as broker:
        refused = dpstream("produce", *cfg, "--csv", str(bad), env=env, check=False)
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert f"{bad}:{N + 2}" in refused.stderr and "u3" in refused.stderr, refused.stderr
        assert "the upload was aborted: nothing of the file was accepted" in refused.stderr
        assert "sent" not in refused.stdout and "accepted" not in refused.stdout
        uploads = _ends_of_uploads(_log(broker))
        assert list(uploads.values()) == [{"abort"}], uploads  # sent, then aborted
        intake = _handled(path, env)
        assert _reported(intake, 1) == 0 and not intake.get("held_uploads"), intake
        letters = dpstream("dead-letters", *cfg, "--json", env=env).stdout
        assert json.loads(letters) == {}, letters
        good = dpstream("produce", *cfg, "--csv", _csv(tmp_path / "good.csv", 1, range(N)),
                        env=env)
        assert f"{N:,} accepted, 0 rejected" in good.stdout, good.stdout
        uploads = _ends_of_uploads(_log(broker))
        assert sorted(map(sorted, uploads.values())) == [["abort"], ["commit"]], uploads
        # the workers hold step 1 now: a step-1 file is checked whole before anything is sent
        # (its duplicates are counted first), a step-2 file still goes in the one pass
        again = dpstream("produce", *cfg, "--csv", _csv(tmp_path / "again.csv", 1, range(N),
                         extra="u3,1,0\n"), env=env, check=False)
        assert again.returncode == 2 and "aborted" not in again.stderr, again.stderr
        assert len(_ends_of_uploads(_log(broker))) == 2  # nothing sent
        month2 = dpstream("produce", *cfg, "--csv", _csv(tmp_path / "m2.csv", 2, range(N),
                          extra="u3,2,0\n"), env=env, check=False)
        assert month2.returncode == 2, month2.stderr
        assert "the upload was aborted: nothing of the file was accepted" in month2.stderr
        assert len(_ends_of_uploads(_log(broker))) == 3  # sent, then aborted


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_mid_send_aborts_the_upload(deployment, tmp_path):  # noqa: F811
    """Before: Ctrl-C during the send left what the broker had acknowledged on the log, taken by
    the workers. Now: one line, exit 130, the upload aborted (its messages on the log are
    followed by abort records, no commit) and the workers accept none of it. The interrupt is
    sent once the upload's first message is on the log (the process stopped meanwhile, so it is
    mid-send whatever the machine's speed)."""
    path, env = deployment
    users = 200_000
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(dict(yaml.safe_load(path.read_text()), roster={"size": users})))
    env = dict(env, DPSTREAM_UPLOAD_CHUNK_ROWS="200")
    step1 = _csv(tmp_path / "s1.csv", 1, range(users))
    with running(big, env, tmp_path) as broker:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "produce", "--config", str(big), "--csv",
             step1], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_default_sigint)
        consumer = KafkaConsumer(bootstrap_servers=broker, **kafka_security())
        try:
            consumer.assign([TopicPartition(TOPIC, p) for p in (0, 1)])
            deadline = time.monotonic() + 120
            while not any(upload_of(r.headers) for batch in consumer.poll(50).values()
                          for r in batch):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            os.kill(proc.pid, signal.SIGSTOP)  # mid-send: its first message is on the log
        finally:
            consumer.close()
        proc.send_signal(signal.SIGINT)
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (out, err)
        ours = [line for line in err.splitlines() if line.startswith("dpstream:")]
        assert len(ours) == 1 and "Traceback" not in err, err
        assert ours[0].startswith(f"dpstream: interrupted (Ctrl-C) while sending {step1}")
        assert "the upload was aborted: nothing of the file was accepted" in ours[0]
        assert "sent" not in out
        uploads = _ends_of_uploads(_log(broker))
        assert list(uploads.values()) == [{"abort"}], uploads
        intake = _handled(big, env)
        assert _reported(intake, 1) == 0, intake
