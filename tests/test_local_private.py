"""The local default keeps its files and its Redis from other local users: DPSTREAM_HOME, the state and log
directories owner-only (0700), the endpoints file and logs 0600, the embedded Redis refusing a connection
without the generated password (kept in owner-only files, never on a command line or in the endpoints file);
a password inside DPSTREAM_REDIS refused without being printed (real `dpstream up`, real processes)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest
import redis

from support.cli import deployment, dpstream  # noqa: F401 - `deployment` is a fixture

from pipeline.connections import redis_client
from pipeline.security import redact_url
from pipeline.stream.local.cluster import process_cmdline
from pipeline.stream.local.embedded import EmbeddedRedis, LOCAL_SECRETS_ENV


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_embedded_redis_refuses_a_connection_without_its_generated_password(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError),
                           match="NOAUTH|Authentication required|HELLO must be called"):
            redis.Redis.from_url(server.url).get("dpstream:any:release:step:1")
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(server.url, password="guess").ping()
        assert redis_client(server.url).ping()  # this process tree finds the password in its owner-only file
        secrets = os.environ[LOCAL_SECRETS_ENV]
        assert mode(secrets) == 0o700 and mode(os.path.join(secrets, f"redis-{server.port}")) == 0o600
        assert mode(tmp_path / "redis") == 0o700 and mode(tmp_path / "redis" / "password") == 0o600
        password = (tmp_path / "redis" / "password").read_text()
        assert password not in server.url and len(password) >= 32
    finally:
        server.stop()
    restarted = EmbeddedRedis(tmp_path / "redis", port=server.port).start()  # the same state, the same password
    try:
        assert redis_client(restarted.url).ping()
    finally:
        restarted.stop()


def test_up_leaves_nothing_another_local_user_can_read(deployment, tmp_path):
    path, env = deployment
    env = {k: v for k, v in env.items() if k != LOCAL_SECRETS_ENV}  # `up` draws and keeps its own
    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up", "--config", str(path), "--workers", "1",
                           "--log-dir", str(tmp_path / "logs")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert "dpstream up: broker" in up.stdout.readline()
        home = tmp_path / "home"
        endpoints = home / "cli-test.json"
        record = json.loads(endpoints.read_text())
        assert mode(home) == 0o700 and mode(home / "cli-test") == 0o700 and mode(endpoints) == 0o600
        logs = tmp_path / "logs"
        assert mode(logs) == 0o700
        assert {p.name for p in logs.iterdir()} >= {"releaser.log", "worker-0.log"}
        assert all(mode(p) == 0o600 for p in logs.iterdir()), {p.name: oct(mode(p)) for p in logs.iterdir()}
        # the Redis it started refuses a login-less connection; its password is nowhere in clear but its files
        with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError)):
            redis.Redis.from_url(record["redis"]).keys("*")
        password = (home / "cli-test" / "redis" / "password").read_text()
        assert password not in endpoints.read_text()
        for proc in record["processes"].values():
            assert password not in (process_cmdline(proc["pid"]) or ""), proc
        # the operator's commands find it through the endpoints file (another process, not a child of `up`)
        deadline = time.monotonic() + 30
        while True:
            status = dpstream("status", "--config", str(path), "--json", env=env, check=False)
            if status.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["deployment"] == "cli-test" and password not in status.stdout
    finally:
        up.send_signal(2)
        up.wait(timeout=60)


def test_a_password_in_dpstream_redis_is_refused_and_never_printed(deployment):
    path, env = deployment
    for command in (("status",), ("close", "--step", "1")):
        proc = dpstream(*command, "--config", str(path), env=dict(env, DPSTREAM_BROKER="127.0.0.1:1",
                                                                  DPSTREAM_REDIS="redis://u:hunter2-secret@127.0.0.1:1/0"),
                        check=False, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "DPSTREAM_REDIS: the URL carries a password" in proc.stderr
        assert "hunter2" not in proc.stderr + proc.stdout
    job = subprocess.run([sys.executable, "-m", "jobs.worker", "--config", str(path), "--broker", "127.0.0.1:1"],
                         env=dict(env, DPSTREAM_REDIS="redis://:hunter2-secret@127.0.0.1:1/0"), capture_output=True,
                         text=True, timeout=60)
    assert job.returncode == 2 and "--redis/DPSTREAM_REDIS: the URL carries a password" in job.stderr
    assert "hunter2" not in job.stderr + job.stdout
    assert redact_url("redis://user:hunter2@host:6379/0") == "redis://user:***@host:6379/0"


def test_a_directory_the_user_named_is_not_narrowed_but_what_dpstream_writes_in_it_is(tmp_path):
    from pipeline.stream.local.embedded import open_private_log, private_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: `--log-dir /tmp` must not take it from the other users
    assert mode(private_dir(shared, narrow=False)) == 0o1777
    with open_private_log(shared / "worker-0.log") as fh:
        fh.write(b"x")
    assert mode(shared / "worker-0.log") == 0o600
    created = private_dir(tmp_path / "new" / "logs", narrow=False)
    assert mode(created) == 0o700
