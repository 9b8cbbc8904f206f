"""`dpstream produce --dry-run` counts an upload's reports as the workers hold them: only once the
upload's commit record is on the log, stating the number of its messages on the partition, and in
the window at the commit's position; an aborted upload, one never committed, a commit that states
another count and a commit after the second close since the upload's first message count nothing
(docs/own-data.md, "Dry run"; the protocol: pipeline/stream/ingest/uploads.py). Each count is
compared with what the workers hold (`dpstream status`), and `produce` refuses a file as wholly
held only when its upload was committed. The upload's records are written to the reports log
directly, as `produce` writes them (`dpstream up`: embedded broker, Redis, a worker and the
releaser)."""

from __future__ import annotations

import json
import os
import signal

from support.cli import deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture
from support.report_log import (
    IN_MEMORY,
    RawUpload,
    dry_run,
    report_csv,
    with_max_ahead,
    worker_pids,
    workers_hold,
)


def test_only_committed_uploads_count_in_the_dry_run(deployment, tmp_path):  # noqa: F811
    """Before: the dry run counted every message on the log as a report (300 of the 400 users
    held): an aborted upload, one never committed and one whose commit states the wrong count
    too, which the workers drop or dead-letter as ``uncommitted``. Now only the committed one
    (100), and the uncommitted one once its commit is on the log (150)."""
    path, env = deployment
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path, *IN_MEMORY) as broker:
        RawUpload(broker, 1, range(0, 100)).end(commit=True)
        RawUpload(broker, 1, range(100, 200)).end(commit=False)
        pending = RawUpload(broker, 1, range(200, 250))
        RawUpload(broker, 1, range(250, 300)).end(commit=True, stated=1)
        count, out = dry_run(cfg, env, tmp_path / "a.csv", 1, range(400))
        assert count == 100, out
        assert "1 upload(s) on the log not committed yet are not counted" in out, out
        assert workers_hold(cfg, env, 1) == 100
        pending.end(commit=True)
        count, out = dry_run(cfg, env, tmp_path / "b.csv", 1, range(400))
        assert count == 150, out
        assert "not committed yet" not in out, out
        assert workers_hold(cfg, env, 1) == 150

        # a commit the (stopped) worker has not handled counts: it applies the upload there,
        # before anything sent after the dry run
        workers = worker_pids(tmp_path)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            RawUpload(broker, 1, range(300, 340)).end(commit=True)
            count, out = dry_run(cfg, env, tmp_path / "c.csv", 1, range(400), wait="1")
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        assert count == 190, out
        assert workers_hold(cfg, env, 1) == 190

        # sent to one partition: the other partition's users are forwarded to their owner when
        # the commit is applied
        RawUpload(broker, 1, range(340, 380), partition=0).end(commit=True)
        count, out = dry_run(cfg, env, tmp_path / "d.csv", 1, range(400))
        assert count == 230, out
        assert workers_hold(cfg, env, 1) == 230


def test_an_upload_counts_in_the_window_at_its_commit(deployment, tmp_path):  # noqa: F811
    """With step 1 open and ``max_ahead: 2``, step-4 reports are too far ahead. Before: the dry run
    read an upload at its messages' positions: one of step 4 sent then and committed after step
    1's close counted nothing, though the workers apply it at the commit, where step 4 is open;
    and one sent after step 1's close, not committed by the second close after it (the workers
    dead-letter it there, and ignore its commit after), counted: 60 duplicates foreseen, 80 held.
    Now 80."""
    path, env, cfg = with_max_ahead(deployment, 2)
    with running(path, env, tmp_path, *IN_MEMORY) as broker:
        ahead = RawUpload(broker, 4, range(80))
        dpstream("close", *cfg, "--step", "1", env=env)
        ahead.end(commit=True)
        expired = RawUpload(broker, 4, range(100, 160))  # step 4 in the window 2..4
        dpstream("close", *cfg, "--step", "2", env=env)
        dpstream("close", *cfg, "--step", "3", env=env)
        expired.end(commit=True)
        count, out = dry_run(cfg, env, tmp_path / "a.csv", 4, range(200))
        assert count == 80, out
        assert workers_hold(cfg, env, 4) == 80
        letters = json.loads(dpstream("dead-letters", *cfg, "--json", env=env).stdout)
        assert letters["uncommitted"]["count"] == 60, letters  # its reports, in 4 messages


def test_an_upload_begun_before_the_read_starts_counts(deployment, tmp_path):  # noqa: F811
    """``max_ahead: 0``. A step-3 upload sent while step 2 was open, committed after step 2's
    close, is applied at the commit (step 3 open then). The dry run reads the log from a close
    marker: from step 2's it would see the commit but none of the messages (0 duplicates
    foreseen, 70 held); it reads from the marker before (step 1's) and counts them."""
    path, env, cfg = with_max_ahead(deployment, 0)
    with running(path, env, tmp_path, *IN_MEMORY) as broker:
        dpstream("close", *cfg, "--step", "1", env=env)
        early = RawUpload(broker, 3, range(70))
        dpstream("close", *cfg, "--step", "2", env=env)
        early.end(commit=True)
        count, out = dry_run(cfg, env, tmp_path / "a.csv", 3, range(200))
        assert count == 70, out
        assert "log's start" not in out  # both markers are in the workers' history
        assert workers_hold(cfg, env, 3) == 70


def test_produce_refuses_only_a_file_whose_upload_was_committed(deployment, tmp_path):  # noqa: F811
    """The workers hold reports of step 1 (a committed upload), so `produce` counts a file's
    duplicates exactly before sending. Before: the reports of an aborted upload counted as held,
    and the file of its 100 users was refused, "every one of the 100 reports is of a user the
    workers already hold" (exit 3), though the workers hold none of them. Now it is sent and all
    100 are accepted; the committed upload's file is still refused."""
    path, env = deployment
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path, *IN_MEMORY) as broker:
        RawUpload(broker, 1, range(100)).end(commit=True)
        RawUpload(broker, 1, range(100, 200)).end(commit=False)
        aborted = dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "a.csv", 1, range(100, 200)),
                           env=env, check=False)
        assert aborted.returncode == 0, (aborted.stdout, aborted.stderr)
        assert "100 accepted, 0 rejected" in aborted.stdout, aborted.stdout
        committed = dpstream("produce", *cfg, "--csv", report_csv(tmp_path / "b.csv", 1, range(100)),
                             env=env, check=False)
        assert committed.returncode == 3, (committed.stdout, committed.stderr)
        assert "every one of the 100 reports is of a user the workers already hold" in \
            committed.stderr
