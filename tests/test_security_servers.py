"""Security against real servers started here: the embedded Redis with an ACL login, the embedded broker,
and TLS end to end through a TLS terminator in front of both (see tests/tls_helpers.py for why one is
needed). The commands and the jobs run as separate processes, as an operator runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import load_config
from pipeline.connections import use_security
from pipeline.security import Security
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedBroker, EmbeddedRedis, free_port
from pipeline.stream.releaser.engine import batch_reference
from pipeline.stream.ingest.roster import Roster
from jobs.eval.testbed import binary_panel
from tls_helpers import TlsTerminator, make_pki

PASSWORD = "correct-horse-7f3a9"
WRONG = "wrong-battery-0c1d"
N, T = 300, 3


def deployment_yaml(path: Path, name: str, broker: str, redis: str, security: dict) -> Path:
    cfg = {"name": name, "broker": broker, "redis": redis, "roster": {"size": N}, "horizon": T,
           "topics": {"partitions": 2}, "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
           "random": {"kind": "seeded", "seed": 5}, "security": security,
           "releases": [{"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.5},
                        {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5}]}
    path.write_text(yaml.safe_dump(cfg))
    return path


def dpstream(*args, env, timeout=90):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def assert_one_line_failure(proc, code: int, expect: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert expect in lines[0], lines[0]


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) with a LISTEN socket on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.fixture(scope="module")
def acl_services(tmp_path_factory):
    """Embedded broker + embedded Redis requiring the ACL user ``curator`` (default user disabled)."""
    directory = tmp_path_factory.mktemp("acl")
    broker = EmbeddedBroker().start()
    redis_server = EmbeddedRedis(directory / "redis", username="curator", password=PASSWORD).start()
    try:
        yield broker, redis_server
    finally:
        broker.stop()
        redis_server.stop()


def test_embedded_services_listen_on_loopback_only_and_keep_files_owner_only(acl_services):
    broker, redis_server = acl_services
    assert listening_addresses(redis_server.port) == {"0100007F"}  # 127.0.0.1, and no IPv6 socket
    assert listening_addresses(broker.port) == {"0100007F"}
    redis_server._client.set("probe", "x")  # something to write through the append-only file
    assert redis_server.data_dir.stat().st_mode & 0o777 == 0o700
    files = [p for p in redis_server.data_dir.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".aof") for p in files), files
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o600" for p in files}
    config = Path(redis_server._client.redis_configuration_filename).read_text()
    assert PASSWORD not in config and "#" in config  # only the SHA-256 of the password reaches the server


def test_acl_login_from_the_cli_and_the_jobs(acl_services, tmp_path):
    broker, redis_server = acl_services
    security = {"redis": {"username": "curator", "password": {"env": "DPSTREAM_REDIS_PASSWORD"}}}
    path = deployment_yaml(tmp_path / "acl.yaml", "acl-login", broker.bootstrap, redis_server.url, security)
    env = dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"), DPSTREAM_REDIS_PASSWORD=PASSWORD)

    ok = dpstream("status", "--config", str(path), "--json", env=env)
    assert ok.returncode == 0, ok.stderr
    assert '"deployment": "acl-login"' in ok.stdout

    wrong = dict(env, DPSTREAM_REDIS_PASSWORD=WRONG)
    outputs = []
    for command in ("status", "close", "worker", "releaser"):
        args = ["--step", "1", "--wait", "2"] if command == "close" else []
        started = time.monotonic()
        proc = dpstream(command, "--config", str(path), *args, env=wrong)
        assert time.monotonic() - started < 30, f"{command} took too long to fail"
        assert_one_line_failure(proc, 1, "Redis refused the login")
        assert "security.redis.username/password" in proc.stderr
        outputs.append(proc.stdout + proc.stderr)

    unset = {k: v for k, v in env.items() if k != "DPSTREAM_REDIS_PASSWORD"}
    proc = dpstream("status", "--config", str(path), env=unset)
    assert_one_line_failure(proc, 2, "security.redis.password: environment variable DPSTREAM_REDIS_PASSWORD is not set")

    plan = dpstream("plan", "--config", str(path), env=env)
    assert plan.returncode == 0
    outputs += [ok.stdout + ok.stderr, plan.stdout + plan.stderr, proc.stdout + proc.stderr]
    for text in outputs:  # no command prints a configured secret, right or wrong
        assert PASSWORD not in text and WRONG not in text


def test_a_stream_runs_end_to_end_over_tls_with_client_certificates_and_an_acl_login(tmp_path, monkeypatch):
    """Workers, releaser, the driver's producer and consumer, topic creation and the CLI all connect
    through TLS (server verified against the test CA, client certificate required) to the real broker
    and Redis; the published synthetic data equals the batch run of the library."""
    pki = make_pki(tmp_path / "pki")
    redis_server = EmbeddedRedis(tmp_path / "redis", username="curator", password=PASSWORD).start()
    redis_tls = TlsTerminator(pki, redis_server.port).start()
    broker_tls_port = free_port()  # the broker advertises the terminator's port, so clients come back through it
    broker = EmbeddedBroker(advertised=f"127.0.0.1:{broker_tls_port}").start()
    broker_tls = TlsTerminator(pki, broker.port, port=broker_tls_port).start()
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    security = {"broker": {"tls": tls},
                "redis": {"username": "curator", "password": {"file": str(tmp_path / "redis-password")}, "tls": tls}}
    (tmp_path / "redis-password").write_text(PASSWORD)
    path = deployment_yaml(tmp_path / "tls.yaml", "tls-e2e", f"127.0.0.1:{broker_tls_port}",
                           f"rediss://127.0.0.1:{redis_tls.port}/0", security)
    dep = load_config(path)
    use_security(dep.security)
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))
    X = binary_panel(9, N, T)
    try:
        with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
            for t in range(1, T + 1):
                drv.producer.send_step(t, {"pov": X[:, t - 1]})
                drv.close(t)
            status = dpstream("status", "--config", str(path), "--json", env=dict(os.environ))
            drv.shutdown()
            cluster.check_alive()
        ref = batch_reference(dep, {"pov": X})
        for name in ("fw", "cu"):
            np.testing.assert_array_equal(drv.panels.panels[name].as_array(), ref[name])
        assert status.returncode == 0 and '"released_step": 3' in status.stdout, status.stderr
        assert broker_tls.handshakes >= 4 and redis_tls.handshakes >= 3  # every process went through TLS

        # a client that does not trust the server's CA is refused, as one line
        untrusted = dict(security, redis=dict(security["redis"], tls=dict(tls, ca_file=str(pki.other_ca))))
        bad = deployment_yaml(tmp_path / "untrusted.yaml", "tls-e2e", f"127.0.0.1:{broker_tls_port}",
                              f"rediss://127.0.0.1:{redis_tls.port}/0", untrusted)
        proc = dpstream("status", "--config", str(bad), env=dict(os.environ))
        assert_one_line_failure(proc, 1, "TLS handshake failed")
        assert PASSWORD not in proc.stdout + proc.stderr
    finally:
        use_security(Security())
        broker_tls.stop()
        redis_tls.stop()
        broker.stop()
        redis_server.stop()
