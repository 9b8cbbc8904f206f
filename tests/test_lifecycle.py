"""Lifecycle of a local deployment: `dpstream up` stops everything it started on SIGTERM as on Ctrl-C,
`dpstream down` stops it from elsewhere, stale endpoints files are reported and cleaned, and expected
failures (bad queries, unreachable services) are one line and an exit code (real processes and services)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support.cli import N, deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture

from pipeline.stream.local.embedded import free_port, pid_alive

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


def _start_up(path, env, tmp_path):
    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up", "--config", str(path), "--workers", "2",
                           "--log-dir", str(tmp_path / "logs")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    banner = up.stdout.readline()
    assert "dpstream up: broker" in banner, banner + up.stdout.read()
    record = json.loads((tmp_path / "home" / "cli-test.json").read_text())
    assert record["pid"] == up.pid
    assert set(record["processes"]) == {"releaser", "worker-0", "worker-1", "broker", "object-store", "redis",
                                        "broker-gate"}  # the embedded broker's mutual-TLS gate
    pids = {name: p["pid"] for name, p in record["processes"].items()}
    assert all(pid_alive(pid) for pid in pids.values()), pids
    return up, pids


def _all_gone(pids: dict[str, int], timeout: float = 5.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids.values()):
        time.sleep(0.1)
    return {name: pid for name, pid in pids.items() if pid_alive(pid)}


def _one_line(proc) -> str:
    """The command failed with exactly one line on stderr, no traceback."""
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("dpstream: "), proc.stderr
    return err


def _wait_released(path, env, step: int) -> None:
    deadline = time.monotonic() + 60
    while json.loads(dpstream("status", "--config", str(path), "--json", env=env).stdout)["released_step"] < step:
        assert time.monotonic() < deadline, f"step {step} not released within 60 s"
        time.sleep(0.3)


def test_sigterm_to_up_stops_everything_it_started(deployment, tmp_path):
    """Before: `kill <pid of up>` orphaned the broker, Redis, the releaser and the workers, and left the
    endpoints file behind."""
    path, env = deployment
    up, pids = _start_up(path, env, tmp_path)
    up.send_signal(signal.SIGTERM)  # to `up` alone, as `kill` does (not to its process group)
    assert up.wait(timeout=60) == 0, up.stdout.read()
    assert _all_gone(pids) == {}
    assert not (tmp_path / "home" / "cli-test.json").exists()
    assert (tmp_path / "home" / "cli-test" / "redis").is_dir()  # persistent data is kept


def test_down_stops_a_running_up_and_the_state_survives(deployment, tmp_path):
    path, env = deployment
    cfg = ["--config", str(path)]
    up, pids = _start_up(path, env, tmp_path)
    try:
        second = dpstream("up", *cfg, env=env, check=False)  # would share the Redis data directory
        assert second.returncode == 2 and "already running" in _one_line(second) and str(up.pid) in second.stderr
        dpstream("produce", "--simulate", *cfg, env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        _wait_released(path, env, 1)
        down = dpstream("down", *cfg, env=env, timeout=90)
        assert f"stopped `dpstream up` (pid {up.pid})" in down.stdout
        assert up.wait(timeout=10) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert _all_gone(pids) == {}
    assert not (tmp_path / "home" / "cli-test.json").exists()
    assert "nothing to stop" in dpstream("down", *cfg, env=env).stdout
    with running(path, env, tmp_path):  # the persistent Redis kept the release records and the ledger
        status = json.loads(dpstream("status", *cfg, "--json", env=env).stdout)
        assert status["released_step"] == 1 and len(status["ledger"]) == 1  # cumulative step 1 only


def test_stale_endpoints_file_is_reported_and_cleaned_by_down(deployment, tmp_path):
    """A file left by a killed `up`: the other commands say so (no Redis/Kafka traceback), and `down`
    removes it and stops the processes it recorded, but only those whose command line still matches."""
    path, env = deployment
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = subprocess.Popen(["sleep", "120"], start_new_session=True)
    reused = subprocess.Popen(["sleep", "121"], start_new_session=True)  # pid reused by something else
    try:
        home = tmp_path / "home"
        home.mkdir()
        (home / "cli-test.json").write_text(json.dumps({
            "broker": f"127.0.0.1:{free_port()}", "redis": f"redis://127.0.0.1:{free_port()}/0", "pid": dead.pid,
            "processes": {"worker-0": {"pid": orphan.pid, "cmdline": "sleep 120"},
                          "releaser": {"pid": reused.pid, "cmdline": "python -m pipeline.cli releaser"}}}))
        for command in (("status",), ("query", "--release", "cumulative", "--step", "1"), ("produce", "--simulate")):
            proc = dpstream(*command, "--config", str(path), env=env, check=False, timeout=30)
            assert proc.returncode == 2, proc.stderr
            assert f"stale endpoints file {home / 'cli-test.json'}" in _one_line(proc)
            assert f"pid {dead.pid}) is no longer running" in proc.stderr and "dpstream down --config" in proc.stderr
        down = dpstream("down", "--config", str(path), env=env)
        assert "removed stale endpoints file" in down.stdout and f"worker-0 (pid {orphan.pid})" in down.stdout
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert reused.poll() is None  # its command line differs from the record: left alone
        assert not (home / "cli-test.json").exists()
    finally:
        for p in (orphan, reused):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_query_errors_are_one_line_with_the_right_exit_code(deployment, tmp_path):
    path, env = deployment
    cfg = ["--config", str(path)]
    with running(path, env, tmp_path):
        dpstream("produce", "--simulate", *cfg, env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        _wait_released(path, env, 1)
        ok = json.loads(dpstream("query", *cfg, "--release", "cumulative", "--step", "1", "--json",
                                 env=env).stdout)
        assert ok["at_least"][0] == N

        proc = dpstream("query", *cfg, "--release", "quartely", "--step", "2", env=env, check=False)
        assert proc.returncode == 2
        assert _one_line(proc) == "dpstream: no such release 'quartely'; releases with counts are quarterly, cumulative"
        proc = dpstream("export", *cfg, "--release", "quartely", "--out", str(tmp_path / "x.csv"), env=env, check=False)
        assert proc.returncode == 2 and "no such release 'quartely'" in _one_line(proc)

        proc = dpstream("query", *cfg, "--release", "quarterly", "--step", "1", env=env, check=False)  # window 2
        line = _one_line(proc)
        assert proc.returncode == 2 and "release 'quarterly' answers from step 2 on" in line and "got --step 1" in line

        for release in ("quarterly", "cumulative"):  # step 2 is not closed: not released
            proc = dpstream("query", *cfg, "--release", release, "--step", "2", env=env, check=False)
            assert proc.returncode == 1, proc.stderr
            assert f"release {release!r} has not released step 2 yet" in _one_line(proc)
            assert ("(released through step 1)" if release == "cumulative" else "(nothing released)") in proc.stderr
        proc = dpstream("query", *cfg, "--release", "cumulative", "--step", "9", env=env, check=False)
        assert proc.returncode == 2 and "--step must be in 1..4, got 9" in _one_line(proc)


def test_unreachable_broker_or_redis_is_one_line_and_exit_1_within_the_bound(deployment):
    path, env = deployment
    listener = socket.create_server(("127.0.0.1", 0))  # something answers TCP here, but it is not Redis
    try:
        busy = f"127.0.0.1:{listener.getsockname()[1]}"
        for broker, redis_url, what in ((f"127.0.0.1:{free_port()}", f"redis://{busy}/0", "broker unreachable"),
                                        (busy, f"redis://127.0.0.1:{free_port()}/0", "Redis unreachable")):
            for command in (("status",), ("query", "--release", "cumulative", "--step", "1"),
                            ("close", "--step", "1"), ("produce", "--simulate")):
                start = time.monotonic()
                proc = dpstream(*command, "--config", str(path), env=dict(env, DPSTREAM_BROKER=broker,
                                                                          DPSTREAM_REDIS=redis_url),
                                check=False, timeout=60)
                assert time.monotonic() - start < 15, command
                assert proc.returncode == 1, (command, proc.stderr)
                # an analyst's query reads the public topics only, never Redis: the listener that is not a
                # broker is what it reports, within the same bound
                expected = "broker unreachable" if command[0] == "query" else what
                assert _one_line(proc).startswith(f"dpstream: {expected}"), proc.stderr
    finally:
        listener.close()


def test_an_up_that_is_still_starting_is_neither_replaced_nor_read(deployment, tmp_path):
    """`up` claims the endpoints file with its pid before starting anything (here: a live process, this one)."""
    path, env = deployment
    home = tmp_path / "home"
    home.mkdir()
    (home / "cli-test.json").write_text(json.dumps({"pid": os.getpid()}))
    proc = dpstream("status", "--config", str(path), env=env, check=False, timeout=30)
    assert proc.returncode == 1 and f"(pid {os.getpid()}) is still starting" in _one_line(proc)
    proc = dpstream("up", "--config", str(path), env=env, check=False, timeout=30)
    assert proc.returncode == 2 and "already running" in _one_line(proc)
    assert json.loads((home / "cli-test.json").read_text()) == {"pid": os.getpid()}  # left as it was
