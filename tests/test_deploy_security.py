"""The deploy files use the security settings (structure and consistency; no Docker or Kubernetes here):
Kafka only on SASL_SSL with an authorizer, Redis only on TLS with an ACL file and owner-only data,
each process with its own role's credentials mounted where the configuration reads them, NetworkPolicies
admitting only the stream processes to Redis, and the shipped ACL script equal to what the code derives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.acl import ROLES, kafka_acl_script
from pipeline.config import load_config
from support.deploy_files import (DEPLOY, K8S, compose, compose_config_path,  # noqa: F401 - fixtures
                                  configmap_deployment, k8s, k8s_objects)

CONFIG = "deploy/config/dpstream.yaml"


def secret_paths(dep) -> set[str]:
    """Every file the configuration reads a secret or a CA from."""
    b, r = dep.security.broker, dep.security.redis
    return {b.tls.ca_file, b.sasl.password.file, r.password.file, r.tls.ca_file}


def test_shipped_acl_script_is_what_the_code_derives():
    dep = load_config(DEPLOY / "config" / "dpstream.yaml")
    assert (DEPLOY / "kafka-acls.sh").read_text() == kafka_acl_script(dep, CONFIG)
    assert os.access(DEPLOY / "kafka-acls.sh", os.X_OK)
    out = subprocess.run(["sh", "-n", str(DEPLOY / "kafka-acls.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_compose_connections_are_tls_sasl_and_acl(compose):
    services = compose["services"]
    dep = load_config(compose_config_path(compose, "worker"))
    assert dep.security.broker.protocol == "SASL_SSL" and dep.redis.startswith("rediss://")
    kafka = services["kafka"]["environment"]
    protocols = dict(p.split(":") for p in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = [listener.split("://")[0] for listener in kafka["KAFKA_LISTENERS"].split(",")]
    assert {protocols[n] for n in listeners if n != kafka["KAFKA_CONTROLLER_LISTENER_NAMES"]} == {"SASL_SSL"}
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false" and kafka["KAFKA_AUTHORIZER_CLASS_NAME"]
    redis_cmd = services["redis"]["command"]
    port = int(re.match(r"rediss://[^:/]+:(\d+)", dep.redis).group(1))
    assert redis_cmd[redis_cmd.index("--port") + 1] == "0"  # no plaintext port
    assert int(redis_cmd[redis_cmd.index("--tls-port") + 1]) == port and "--aclfile" in redis_cmd
    assert "umask 077" in " ".join(services["redis"]["entrypoint"]) and "chmod 0700 /data" in " ".join(
        services["redis"]["entrypoint"])
    for service, role in (("worker", "worker"), ("releaser", "releaser"), ("topics", "admin")):
        env = {**compose["x-dpstream"]["environment"], **services[service].get("environment", {})}
        assert env["DPSTREAM_KAFKA_USER"] == f"dpstream-{role}", service
        mounted = {s["target"]: s["source"] for s in services[service]["secrets"]}
        needed = {dep.security.broker.tls.ca_file, dep.security.broker.sasl.password.file}
        if service != "topics":  # topic creation needs Kafka only
            needed |= secret_paths(dep)
            assert env["DPSTREAM_REDIS_USER"] == f"dpstream-{role}", service
            assert mounted[dep.security.redis.password.file] == f"redis-{role}"
        assert needed <= set(mounted), (service, needed - set(mounted))
        assert mounted[dep.security.broker.sasl.password.file] == f"kafka-{role}"


def test_make_secrets_writes_every_compose_secret(compose, tmp_path):
    if not subprocess.run(["sh", "-c", "command -v openssl"], capture_output=True).returncode == 0:
        pytest.skip("openssl is not installed")
    out_dir = tmp_path / "secrets"
    run = subprocess.run(["sh", str(DEPLOY / "make-secrets.sh"), str(out_dir)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=sys.executable), timeout=300)
    assert run.returncode == 0, run.stderr
    assert out_dir.stat().st_mode & 0o777 == 0o700
    for name, secret in compose["secrets"].items():
        assert (out_dir / Path(secret["file"]).name).is_file(), name
    acl = (out_dir / "users.acl").read_text().splitlines()
    assert acl[0] == "user default off" and len(acl) == 4
    for role in ("worker", "releaser", "operator"):  # hashed: the file never holds a password in clear
        assert (out_dir / f"redis-{role}").read_text().strip() not in "\n".join(acl)
    assert {f"kafka-{r}" for r in ROLES} <= {p.name for p in out_dir.iterdir()}


def test_k8s_pods_mount_their_role_credentials_where_the_config_reads_them(k8s, tmp_path):
    dep = configmap_deployment(k8s, tmp_path)
    assert dep.security.broker.protocol == "SASL_SSL" and dep.redis.startswith("rediss://")
    secrets_named = set()
    for name, role in (("dpstream-worker", "worker"), ("dpstream-releaser", "releaser")):
        workload = {**k8s_objects(k8s, "Deployment"), **k8s_objects(k8s, "StatefulSet")}[name]
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container, user, needs in ((pod["containers"][0], f"dpstream-{role}", secret_paths(dep)),
                                       (pod["initContainers"][0], "dpstream-admin",
                                        {dep.security.broker.tls.ca_file, dep.security.broker.sasl.password.file})):
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["DPSTREAM_KAFKA_USER"] == user, container["name"]
            mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            for path in needs:
                assert str(Path(path).parent) in mounts, (name, container["name"], path)
            credentials = mounts[str(Path(dep.security.broker.sasl.password.file).parent)]["secret"]["secretName"]
            assert credentials == f"{user}-credentials", (name, container["name"])
        assert {e["name"]: e["value"] for e in pod["containers"][0]["env"]}["DPSTREAM_REDIS_USER"] == f"dpstream-{role}"
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
        secrets_named |= {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for workload in k8s_objects(k8s, "StatefulSet").values():
        secrets_named |= {v["secret"]["secretName"] for v in workload["spec"]["template"]["spec"].get("volumes", [])
                          if "secret" in v}
    readme = (DEPLOY / "README.md").read_text()
    assert {s for s in secrets_named if s not in readme} == set()  # every Secret is explained there


def test_k8s_redis_is_tls_only_with_owner_only_data_and_reached_only_by_the_stream_processes(k8s, tmp_path):
    dep = configmap_deployment(k8s, tmp_path)
    redis = k8s_objects(k8s, "StatefulSet")["redis"]
    pod = redis["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    port = int(re.match(r"rediss://[^:/]+:(\d+)", dep.redis).group(1))
    assert c["args"][c["args"].index("--port") + 1] == "0" and int(c["args"][c["args"].index("--tls-port") + 1]) == port
    assert "--aclfile" in c["args"] and "fsGroup" not in pod.get("securityContext", {})
    assert "chmod 0700 /data" in " ".join(c["command"]) and "umask 077" in " ".join(c["command"])
    policies = k8s_objects(k8s, "NetworkPolicy")
    deny = policies["dpstream-default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    selecting_redis = [p["spec"] for p in policies.values()
                       if p["spec"]["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": "redis"}]
    (spec,) = selecting_redis
    (rule,) = spec["ingress"]
    assert [p["port"] for p in rule["ports"]] == [port]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # pods of this namespace only
    (expr,) = peer["podSelector"]["matchExpressions"]
    assert expr["operator"] == "In" and set(expr["values"]) == {"dpstream-worker", "dpstream-releaser"}
    kafka_port = int(dep.broker.rsplit(":", 1)[1])
    kafka_policy = policies["kafka-clients"]["spec"]
    assert {p["port"] for r in kafka_policy["ingress"] for p in r["ports"]} == {kafka_port, 9093}
    kafka_env = {e["name"]: e["value"] for e in k8s_objects(k8s, "StatefulSet")["kafka"]["spec"]["template"]["spec"][
        "containers"][0]["env"]}
    assert kafka_env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert f"SASL_SSL://kafka-0.kafka.dpstream.svc.cluster.local:{kafka_port}" == kafka_env["KAFKA_ADVERTISED_LISTENERS"]


def test_acl_script_passes_no_password_on_a_command_line(tmp_path):
    """deploy/kafka-acls.sh run against stand-in Kafka tools that record their arguments: every SCRAM
    password reaches kafka-configs.sh in an owner-only file, never as an argument (visible in `ps`)."""
    bin_dir, secrets, record = tmp_path / "bin", tmp_path / "users", tmp_path / "calls"
    bin_dir.mkdir()
    secrets.mkdir()
    for tool in ("kafka-configs.sh", "kafka-acls.sh"):
        (bin_dir / tool).write_text(
            '#!/bin/sh\necho "$*" >> "$RECORD"\n'
            'while [ $# -gt 0 ]; do if [ "$1" = --add-config-file ]; then stat -c %a "$2" >> "$RECORD.modes"; '
            'cat "$2" >> "$RECORD.files"; fi; shift; done\n')
        (bin_dir / tool).chmod(0o755)
    passwords = {role: f"pw-{role}-s3cret" for role in ROLES}
    for role, password in passwords.items():
        (secrets / role).write_text(password)
    run = subprocess.run(["sh", str(DEPLOY / "kafka-acls.sh")], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, KAFKA_BIN=str(bin_dir), BOOTSTRAP="kafka:9094", ADMIN_CONFIG="/x",
                                  SECRETS=str(secrets), RECORD=str(record)))
    assert run.returncode == 0, run.stderr
    calls = record.read_text()
    assert "--add-config-file" in calls and "--allow-principal" in calls
    assert not any(password in calls for password in passwords.values())
    files = Path(f"{record}.files").read_text()
    assert all(f"SCRAM-SHA-512=[iterations=8192,password={password}]" in files for password in passwords.values())
    assert set(Path(f"{record}.modes").read_text().split()) == {"600"}


def test_grafana_admin_password_is_generated_not_the_default(compose):
    grafana = compose["services"]["grafana"]
    env = grafana["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env  # never inline
    path = env["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    assert path == "/run/secrets/grafana-admin" and "grafana-admin" in grafana["secrets"]
    assert compose["secrets"]["grafana-admin"]["file"] == "./secrets/grafana-admin"
    assert "password > grafana-admin" in (DEPLOY / "make-secrets.sh").read_text()


def test_bench_repartition_producer_connects_with_the_security_settings(monkeypatch):
    import asyncio

    import aiokafka
    import numpy as np

    from jobs.bench.bench_repartition import _produce
    from pipeline.connections import use_security
    from pipeline.security import Security

    built = {}

    class Recorder:
        def __init__(self, **kwargs):
            built.update(kwargs)
            raise RuntimeError("recorded")

    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", Recorder)
    monkeypatch.setenv("BENCH_SASL_PW", "bench-secret")
    use_security(Security.model_validate({"broker": {"sasl": {"mechanism": "SCRAM-SHA-512", "username": "w",
                                                              "password": {"env": "BENCH_SASL_PW"}}}}))
    try:
        with pytest.raises(RuntimeError, match="recorded"):
            asyncio.run(_produce("kafka:9093", "t", None, 1, np.zeros(1), np.zeros(1)))
    finally:
        use_security(Security())
    assert built["security_protocol"] == "SASL_PLAINTEXT" and built["sasl_plain_password"] == "bench-secret"
