"""The local supervisor's rules (LocalCluster.supervise) on real child processes that exit as a job would:
a refusal is never retried and carries the process's own line and exit code; an unexpected exit is
restarted with backoff; the restart past the bound stops the deployment with exit code 1. The
supervisor's clock is passed in, so the backoff is checked without waiting for it."""

from __future__ import annotations

import sys
import time

import pytest

import pipeline.stream.local.cluster as cluster_mod
from pipeline.config import parse_config
from pipeline.stream.local.cluster import BACKOFF, MAX_RESTARTS, LocalCluster, ProcessFailed


def _cluster(tmp_path, monkeypatch, script: str) -> LocalCluster:
    """A cluster whose 'worker' runs ``script`` (a real process, its output in the worker's log)."""
    monkeypatch.setattr(cluster_mod, "job_command", lambda *a, **k: [sys.executable, "-c", script])
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))  # the endpoints file the supervisor rewrites
    dep = parse_config({"name": "sup", "broker": "127.0.0.1:1", "redis": "redis://127.0.0.1:1/0",
                        "roster": {"size": 10}, "horizon": 2, "attributes": {"a": {"type": "binary"}},
                        "budget": {"rho": 0.1}, "releases": [{"name": "c", "type": "cumulative", "attribute": "a",
                                                             "share": 1.0}]})
    (tmp_path / "c.yaml").write_text("unused")
    return LocalCluster(tmp_path / "c.yaml", dep, log_dir=tmp_path / "logs")


def _exited(cluster: LocalCluster, name: str) -> None:
    cluster.procs[name].wait(timeout=30)


def test_a_refusal_is_not_retried_and_carries_the_processs_line_and_code(tmp_path, monkeypatch):
    cluster = _cluster(tmp_path, monkeypatch, "import sys, logging\n"
                       "logging.basicConfig(); logging.getLogger('x').error('earlier noise')\n"
                       "print('dpstream: configuration changed: releases.hh.k: 3 -> 20', file=sys.stderr)\n"
                       "sys.exit(2)")
    cluster.spawn("worker", "worker-0")
    _exited(cluster, "worker-0")
    with pytest.raises(ProcessFailed) as err:
        cluster.supervise()
    assert err.value.exit_code == 2 and err.value.name == "worker-0"
    assert str(err.value) == ("worker-0 refused to run (exit code 2): configuration changed: releases.hh.k: 3 -> 20")
    assert cluster.procs["worker-0"].poll() == 2  # not restarted


def test_an_unexpected_exit_is_restarted_with_backoff_until_the_bound(tmp_path, monkeypatch):
    cluster = _cluster(tmp_path, monkeypatch, "raise ValueError('bad thing happened')")
    cluster.spawn("worker", "worker-0")
    now = time.monotonic()
    for restart in range(MAX_RESTARTS):
        first = cluster.procs["worker-0"]
        _exited(cluster, "worker-0")
        done = cluster.supervise(now)
        assert done == [f"worker-0 exited with code 1 (ValueError: bad thing happened); restarting it in "
                        f"{BACKOFF[restart]:g} s"]
        assert cluster.supervise(now + BACKOFF[restart] - 0.01) == []  # still backing off
        now += BACKOFF[restart]
        done = cluster.supervise(now)
        assert len(done) == 1 and done[0].startswith("restarted worker-0 (pid ")
        assert cluster.procs["worker-0"] is not first
    _exited(cluster, "worker-0")
    with pytest.raises(ProcessFailed) as err:
        cluster.supervise(now)
    assert err.value.exit_code == 1
    assert f"worker-0 failed {MAX_RESTARTS + 1} times within 300 s (exit code 1): ValueError: bad thing" in str(err.value)
    # restarts older than the window no longer count
    cluster.restarts["worker-0"].clear()
    assert cluster.supervise(now + 1000)[0].endswith(f"restarting it in {BACKOFF[0]:g} s")
    cluster.stop()


def test_a_killed_process_is_reported_as_such(tmp_path, monkeypatch):
    cluster = _cluster(tmp_path, monkeypatch, "import time; print('started'); time.sleep(60)")
    cluster.spawn("worker", "worker-0")
    cluster.kill("worker-0")
    assert cluster.supervise() == ["worker-0 exited with code -9 (killed by signal 9); restarting it in 1 s"]
    cluster.stop()
