"""How `dpstream produce` waits for the workers' verdict, on real processes (`dpstream up`:
embedded broker, Redis, a worker and the releaser): a verdict that is there a moment after a read
of the workers' snapshots is seen after a short sleep, not a fixed 0.2 s one, and the dead-letter
log is read only when it grew since the send began — the verdict itself unchanged (docs/streaming.md,
"A small file")."""

from __future__ import annotations

import json
import os
import signal
import time

from support.cli import N, deployment, running  # noqa: F401 - `deployment` is a fixture


class _SleepsRecorded:
    """``time`` as :mod:`pipeline.fates` uses it, recording each sleep; the first sleep resumes the
    stopped workers, so the verdict arrives while the wait sleeps."""

    def __init__(self, on_first_sleep):
        self.sleeps: list[float] = []
        self._on_first_sleep = on_first_sleep
        self.monotonic = time.monotonic

    def sleep(self, seconds: float) -> None:
        if not self.sleeps:
            self._on_first_sleep()
        self.sleeps.append(seconds)
        time.sleep(seconds)


def test_the_verdict_is_seen_soon_and_read_only_where_it_can_be(
    deployment, tmp_path, capsys, monkeypatch  # noqa: F811 - the fixture
):
    """Before: the wait slept 0.2 s between reads whatever it waited for, and every verdict read
    the dead-letter log with a consumer of its own (and a log-end probe), even when no report had
    been rejected. Now the first sleep is 10 ms (no sleep longer than before), a log that did not
    grow is not read, and a duplicate send is still read and reported as before."""
    import pipeline.consumer
    import pipeline.fates
    from pipeline.cli.verdict import report_fates
    from pipeline.config import load_config
    from pipeline.fates import dead_letter_mark
    from pipeline.producer import ReportSender
    from pipeline.stream.kafka.topics import topic_names

    path, env = deployment
    monkeypatch.setenv("DPSTREAM_HOME", env["DPSTREAM_HOME"])  # report_fates finds the running `up`
    reads = []
    read_to_end = pipeline.consumer.read_to_end

    def counted(*args, **kwargs):
        reads.append(args[1])
        return read_to_end(*args, **kwargs)

    monkeypatch.setattr(pipeline.consumer, "read_to_end", counted)
    with running(path, env, tmp_path) as broker:
        record = json.loads((tmp_path / "home" / "cli-test.json").read_text())
        workers = [p["pid"] for name, p in record["processes"].items()
                   if name.startswith("worker")]

        def resume() -> None:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)

        dep = load_config(path)
        dead_letters = topic_names(dep)["dead-letter"]
        reports = [{"user": f"u{i}", "step": 1, "values": {"poverty": i % 2}} for i in range(N)]
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # nothing is handled before the wait's first read
        try:
            mark = dead_letter_mark(broker, dead_letters, 1)
            with ReportSender(dep, broker) as sender:
                result = sender.send(reports)
            assert result.acknowledged == N
            clock = _SleepsRecorded(resume)
            monkeypatch.setattr(pipeline.fates, "time", clock)
            assert report_fates(dep, result.receipt, mark, timeout=60) == 0
        finally:
            resume()
        assert f"{N:,} accepted, 0 rejected" in capsys.readouterr().out
        assert clock.sleeps, "the workers were stopped: the wait must have slept"
        assert clock.sleeps[0] <= 0.02, clock.sleeps  # was 0.2
        assert max(clock.sleeps) <= 0.2, clock.sleeps  # never reads less often than before
        assert reads == []  # no report rejected, the log did not grow: nothing to read

        # the same reports again: every one a duplicate, read from the log and reported
        mark = dead_letter_mark(broker, dead_letters, 1)
        with ReportSender(dep, broker) as sender:
            result = sender.send(reports)
        assert report_fates(dep, result.receipt, mark, timeout=60) == 5
        assert f"0 accepted, {N:,} rejected (duplicate {N:,})" in capsys.readouterr().out
        assert reads == [[dead_letters]]
