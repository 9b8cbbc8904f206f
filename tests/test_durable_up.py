"""`dpstream up` as an operator meets it: a durable embedded log, supervision instead of tear-down, and a
refused state-less start (real embedded broker, object store and Redis; real processes).

Each test reproduces an observation of a failing run of the old code: a stop/start lost the open
step's reports, which were then released from imputed values; a lost Redis directory started over and
republished with fresh noise; `up` stopped everything when one process died, and hid the reason of a
refusal in a log file with exit code 1."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal

import pytest
import yaml
from support.cli import N, deployment, dpstream  # noqa: F401 - `deployment` is a fixture
from support.stream_runs import wait_until
from support.up import Up, up, wait_released

from pipeline.stream.local.embedded import pid_alive
from pipeline.stream.local.marker import read_marker

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


def _closed_reported(logs, step: int) -> int:
    """Users reported in the workers' close of ``step``, summed over partitions, from their own log lines."""
    found = {}
    for log in logs.glob("worker-*.log"):
        for m in re.finditer(rf"partition (\d+) closed step {step}: .*'reported': (\d+)", log.read_text()):
            found[int(m.group(1))] = int(m.group(2))
    return sum(found.values())


def _marked_released(home) -> int | None:
    """The released step in the deployment marker `up` keeps (None before its first write)."""
    marker = read_marker(home)
    return None if marker is None else marker.released_step


def test_stop_start_keeps_the_open_steps_reports_and_killed_processes_are_restarted(deployment, tmp_path):
    """Before: the memory-only broker forgot step 2's reports on `down`; after `up` the workers closed step 2
    with `reported: 0` (imputed) while `close` printed full coverage. And `up` tore the whole deployment
    down when one worker was killed. Now a killed worker, broker and object store are each restarted, and
    step 2 is released from every user's real report after a stop and a start."""
    path, env = deployment
    cfg = ["--config", str(path)]
    with up(path, env, tmp_path) as run:
        assert f"process logs in {run.logs}" in run.text() and "broker log in" in run.text()
        dpstream("produce", "--simulate", *cfg, "--step", "1", env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        wait_released(path, env, 1)
        pids = run.started()
        os.kill(pids["worker-0"], signal.SIGKILL)
        run.wait_for(r"worker-0 exited with code -9 \(killed by signal 9\); restarting it")
        run.wait_for(r"restarted worker-0 \(pid \d+\)")
        assert run.proc.poll() is None and pid_alive(pids["worker-1"]) and pid_alive(pids["broker"])
        for service in ("broker", "object-store"):  # the embedded services are restarted on their port and data
            os.kill(pids[service], signal.SIGKILL)
            run.wait_for(rf"restarted the embedded {service} \(pid \d+\)")
        dpstream("produce", "--simulate", *cfg, "--step", "2", env=env)
    assert run.proc.returncode == 0
    assert (run.home / "cli-test" / "log" / "dpstream").is_dir()  # the broker's log, kept

    with up(path, env, tmp_path) as run:
        assert _closed_reported(run.logs, 2) == 0  # step 2 was still open at the stop
        dpstream("close", *cfg, "--step", "2", env=env)
        wait_released(path, env, 2)
        assert _closed_reported(run.logs, 2) == N  # the real reports, none imputed
    assert run.proc.returncode == 0


def test_a_lost_redis_directory_is_refused_not_republished(deployment, tmp_path):
    """Before: `rm -rf $DPSTREAM_HOME/<dep>/redis; dpstream up` started a new instance, and closing step 1
    again published a second, independent noise draw (the broker had forgotten the first)."""
    path, env = deployment
    cfg = ["--config", str(path)]
    with up(path, env, tmp_path, workers=1):
        dpstream("produce", "--simulate", *cfg, "--step", "1", env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        wait_released(path, env, 1)
        home = tmp_path / "home" / "cli-test"
        # the marker follows the released step within the supervisor's tick
        wait_until(lambda: _marked_released(home) == 1,
                   "the deployment marker did not record step 1 as released", timeout=30)
    marker = json.loads((home / "deployment.json").read_text())
    assert marker["released_step"] == 1

    shutil.rmtree(home / "redis")
    refused = dpstream("up", *cfg, "--log-dir", str(tmp_path / "logs"), env=env, check=False, timeout=60)
    assert refused.returncode == 4, refused.stderr
    assert (f"state lost: instance {marker['instance']} of this deployment released through step 1, but its Redis "
            "state holds no deployment state") in refused.stderr
    assert "Restore" in refused.stderr and "new deployment under a new name" in refused.stderr
    assert not (tmp_path / "home" / "cli-test.json").exists()

    # Without the marker the releaser's fence sees the step-1 manifests on the durable log, and `up` stops
    # with the releaser's own line and exit code 4 (not 1 and a pointer to a log file).
    (home / "deployment.json").unlink()
    shutil.rmtree(home / "redis")
    run = Up(path, env, tmp_path, workers=1)
    assert run.proc.wait(timeout=90) == 4, run.text()
    assert re.search(r"dpstream: up: releaser refused to run \(exit code 4\): state lost: refusing to release: "
                     r"\S+ already holds \d+ release manifest\(s\) this state does not know", run.text()), run.text()
    assert f"logs in {run.logs}" in run.text()


def test_a_refused_configuration_stops_up_with_exit_2_and_the_reason(deployment, tmp_path):
    """Before: `up: stream processes exited: {'releaser': 2}` and exit code 1, the reason only in a log file."""
    path, env = deployment
    cfg = ["--config", str(path)]
    with up(path, env, tmp_path, workers=1):
        dpstream("produce", "--simulate", *cfg, "--step", "1", env=env)
    changed = yaml.safe_load(path.read_text())
    changed["releases"][1]["share"], changed["releases"][0]["share"] = 0.6, 0.4
    path.write_text(yaml.safe_dump(changed))
    run = Up(path, env, tmp_path, workers=1)
    assert run.proc.wait(timeout=90) == 2, run.text()
    line = run.wait_for(r"dpstream: up: (releaser|worker-0) refused to run \(exit code 2\): (.*)").group(2)
    assert "share" in line and "0.5 -> 0.6" in line.replace("0.5 → 0.6", "0.5 -> 0.6"), line
    assert f"logs in {run.logs}" in run.text()
