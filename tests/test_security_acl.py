"""Least privilege: the per-role grants, and a stream run with each role logged into Redis as its own
ACL user holding only the generated rules (real embedded Redis, real processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import redis
import yaml
from support.acl_services import acl_redis_and_broker, redis_login

from pipeline.acl import ROLES, kafka_acl_commands, kafka_grants, redis_acl_rules
from pipeline.config import load_config, parse_config
from pipeline.connections import redis_client
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.releaser.engine import batch_reference
from pipeline.stream.ingest.roster import Roster
from jobs.eval.testbed import binary_panel
from pipeline.stream.kafka.topics import PUBLIC_TOPICS, topic_names

N, T = 200, 3
PASSWORDS = {"worker": "pw-worker-1", "releaser": "pw-releaser-2", "operator": "pw-operator-3"}


def deployment_dict(name: str, broker: str | None = None, redis_url: str | None = None) -> dict:
    return {"name": name, "broker": broker, "redis": redis_url, "roster": {"size": N}, "horizon": T,
            "topics": {"partitions": 2}, "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
            "random": {"kind": "seeded", "seed": 8},
            "security": {"redis": {"username": {"env": "DPSTREAM_REDIS_USER"},
                                   "password": {"env": "DPSTREAM_REDIS_PASSWORD"}}},
            "releases": [{"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.5},
                         {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5}]}


def test_analysts_get_the_public_topics_only_and_only_curator_roles_read_reports():
    dep = parse_config(deployment_dict("grants", "kafka:9093", "redis://redis:6379/0"))
    names = topic_names(dep)
    public = {names[t] for t in PUBLIC_TOPICS}
    analyst = kafka_grants(dep, "analyst")
    assert {(g.operation, g.name) for g in analyst if g.resource == "topic"} == \
        {(op, t) for t in public for op in ("Read", "Describe")}
    assert {(g.operation, g.name, g.prefixed) for g in analyst if g.resource == "group"} == \
        {("Read", "dpstream-grants-downstream", True)}  # downstream consumers in groups
    readers = {role for role in ROLES for g in kafka_grants(dep, role)
               if g.operation == "Read" and g.name == names["reports"]}
    assert readers == {"worker", "operator"}  # the raw reports: the workers, and the operator's intake counts
    assert {g.name for g in kafka_grants(dep, "producer") if g.operation == "Write"} == {names["reports"]}
    writers_of_public = {role for role in ROLES for g in kafka_grants(dep, role)
                         if g.operation == "Write" and g.name in public}
    assert writers_of_public == {"releaser"}
    commands = kafka_acl_commands(dep, {"worker": "svc-worker"})
    assert any("User:svc-worker" in c and f"--topic {names['step-partials']}" in c and "Write" in c for c in commands)
    with pytest.raises(ValueError, match="role: unknown role 'root'"):
        kafka_grants(dep, "root")


@pytest.fixture
def acl_redis(tmp_path):
    dep = parse_config(deployment_dict("acl-roles", "127.0.0.1:1", "redis://127.0.0.1:1/0"))
    rules = [line.removeprefix("user ") for line in redis_acl_rules(dep, PASSWORDS)]
    with acl_redis_and_broker(tmp_path / "redis", rules) as services:
        yield services


def test_each_role_runs_with_its_own_redis_user_and_no_more(acl_redis, tmp_path, monkeypatch):
    server, broker = acl_redis
    cfg = deployment_dict("acl-roles", broker.bootstrap, server.url)
    path = tmp_path / "acl-roles.yaml"
    path.write_text(yaml.safe_dump(cfg))
    dep = load_config(path)
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DPSTREAM_REDIS_USER", "dpstream-worker")  # the workers inherit the environment
    monkeypatch.setenv("DPSTREAM_REDIS_PASSWORD", PASSWORDS["worker"])
    releaser = {"DPSTREAM_REDIS_USER": "dpstream-releaser", "DPSTREAM_REDIS_PASSWORD": PASSWORDS["releaser"]}
    X = binary_panel(4, N, T)
    cluster = LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs").start(releaser_env=releaser)
    try:
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        for t in range(1, T + 1):
            drv.producer.send_step(t, {"pov": X[:, t - 1]})
            drv.close(t)
        drv.shutdown()
        cluster.check_alive()
    finally:
        cluster.stop()
    ref = batch_reference(dep, {"pov": X})
    for name in ("fw", "cu"):
        np.testing.assert_array_equal(drv.panels.panels[name].as_array(), ref[name])

    operator_env = dict(os.environ, DPSTREAM_REDIS_USER="dpstream-operator",
                        DPSTREAM_REDIS_PASSWORD=PASSWORDS["operator"])
    status = subprocess.run([sys.executable, "-m", "pipeline.cli", "status", "--config", str(path), "--json"],
                            capture_output=True, text=True, env=operator_env, timeout=90)
    assert status.returncode == 0 and '"released_step": 3' in status.stdout, status.stderr

    for role in PASSWORDS:
        monkeypatch.setenv(f"PW_{role}", PASSWORDS[role])
    operator = redis_client(server.url, redis_login("operator"))
    assert operator.get("dpstream:acl-roles:pointer:closing") is not None
    with pytest.raises(redis.exceptions.NoPermissionError):
        operator.set("dpstream:acl-roles:pointer:closing", 0)  # read-only: cannot move the deployment's state
    worker = redis_client(server.url, redis_login("worker"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.get("dpstream:another-deployment:ledger")  # only this deployment's keys
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.config_get("dir")  # no server administration
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.flushall()
