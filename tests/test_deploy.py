"""The deployment files under deploy/ (compose, Dockerfile, Kubernetes, Prometheus, Grafana).

There is no Docker engine or Kubernetes cluster here, so these are structural and consistency
checks: everything parses, the commands are the real `dpstream` commands, the embedded
configurations load with the project's validator, replica counts respect the partition count and
the single releaser, Redis persists every write, and metrics ports agree with what the processes
serve. promtool (from the `prometheus` package, scripts/install-prometheus.sh) validates the
Prometheus configuration and the dashboard's PromQL. The topic-creation script runs for real
against the embedded broker.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config, parse_config
from pipeline.stream.process.metrics import PUBLIC_SERIES, metric_names

from support.deploy_files import (DEPLOY, K8S, REPO, compose, compose_config_path,  # noqa: F401
                                  configmap_deployment, k8s, k8s_objects, read_yaml)

PROMTOOL = "/usr/bin/promtool"
WORKLOADS = ("Deployment", "StatefulSet")


def _promtool() -> str:
    if not Path(PROMTOOL).exists():
        pytest.fail(f"{PROMTOOL} not found: run scripts/install-prometheus.sh (Debian package `prometheus`)",
                    pytrace=False)
    return PROMTOOL


def _metrics_port(env) -> int:
    if isinstance(env, list):  # Kubernetes [{name, value}]
        env = {e["name"]: e.get("value") for e in env}
    return int(env["DPSTREAM_METRICS_PORT"])


# -- every file parses ---------------------------------------------------------------------------------
def test_every_yaml_and_json_file_parses():
    files = list(DEPLOY.rglob("*.yml")) + list(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        # objects, or an RFC 6902 patch (a list of operations) of a kustomize component
        assert docs and all(isinstance(d, dict) or (isinstance(d, list) and d and
                                                     all({"op", "path"} <= set(op) for op in d)) for d in docs), path
    for path in DEPLOY.rglob("*.json"):
        json.loads(path.read_text())


# -- Docker ---------------------------------------------------------------------------------------------
def test_dockerfile_installs_the_project_and_runs_dpstream():
    text = (DEPLOY / "Dockerfile").read_text()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entry = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
    assert entry and json.loads(entry.group(1)) == ["dpstream"]
    # the command's entry point: main on the process's arguments, then its exit (quick_exit.py)
    assert scripts["dpstream"] == "pipeline.cli:run"
    import pipeline.cli

    assert callable(pipeline.cli.run)
    install = re.search(r"^RUN pip install \"?\.(\[[a-z,]+\])?\"?", text, re.M)
    assert install
    # the stream processes need no plots and no analyst page; `produce --csv` (deploy/README.md) needs files
    assert install.group(1) == "[files]"
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):  # every source exists in the build context (repo root)
        for src in line.split()[:-1]:
            assert (REPO / src).exists(), src
    assert re.search(r"^USER\s+(?!root|0\b)", text, re.M), "runs as root"
    port = int(re.search(r"DPSTREAM_METRICS_PORT=(\d+)", text).group(1))
    assert re.search(rf"^EXPOSE\s+{port}\b", text, re.M)
    # The image keeps the metrics on loopback; binding a network interface is the deployment's opt-in.
    assert "DPSTREAM_METRICS_ADDR" not in re.sub(r"#.*", "", text)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    for needed in ("!pyproject.toml", "!README.md", "!pipeline/", "!jobs/", "!deploy/create_topics.py", "!deploy/config/"):
        assert needed in ignore, needed


# -- docker compose -------------------------------------------------------------------------------------
def test_compose_services_and_commands(compose):
    services = compose["services"]
    assert {"kafka", "redis", "worker", "releaser", "prometheus", "grafana"} <= set(services)
    assert services["worker"]["command"][:2] == ["worker", "--config"]
    assert services["releaser"]["command"][:2] == ["releaser", "--config"]
    for name in ("worker", "releaser", "topics"):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / services[name]["build"]["context"] / "pyproject.toml").exists()
    assert services["topics"]["entrypoint"] == ["python", "/opt/dpstream/create_topics.py"]
    for name in ("worker", "releaser"):
        assert services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_compose_config_loads_and_matches_the_services(compose):
    services = compose["services"]
    paths = {compose_config_path(compose, s) for s in ("worker", "releaser", "topics")}
    assert len(paths) == 1, "worker, releaser and topics must run the same deployment"
    dep = load_config(paths.pop())  # validation and budget plan
    assert dep.production and dep.random.kind == "secure"
    host, port = dep.broker.split(":")
    kafka_env = services["kafka"]["environment"]
    listener = f"{dep.security.broker.protocol}://{host}:{port}"  # SASL_SSL (tests/test_deploy_security.py)
    assert host in services and listener in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    redis_host = re.match(r"rediss?://([^:/]+):(\d+)", dep.redis).group(1)
    assert redis_host in services
    assert services["worker"]["deploy"]["replicas"] <= dep.topics.partitions
    assert services["releaser"]["deploy"]["replicas"] == 1


def test_compose_kafka_kraft_and_redis_persistence(compose):
    services = compose["services"]
    env = services["kafka"]["environment"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "ZOOKEEPER" not in " ".join(env)
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in env["KAFKA_LISTENERS"]
    assert len(env["CLUSTER_ID"]) == 22  # base64 of 16 bytes, as kafka-storage format requires
    assert any(v.split(":")[1] == env["KAFKA_LOG_DIRS"] for v in services["kafka"]["volumes"])
    cmd = services["redis"]["command"]
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    assert cmd[cmd.index("--appendfsync") + 1] == "always"
    assert any(v.split(":")[1] == "/data" for v in services["redis"]["volumes"])


def test_compose_metrics_ports_and_prometheus_targets(compose):
    services = compose["services"]
    prom = read_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for service in ("worker", "releaser"):
        port = _metrics_port(services[service]["environment"])
        assert services[service]["environment"]["DPSTREAM_METRICS_ADDR"] == "0.0.0.0"
        sd = jobs[f"dpstream-{service}"]["dns_sd_configs"][0]
        assert sd["names"] == [service] and sd["type"] == "A" and sd["port"] == port
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    assert mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    for name in ("prometheus", "grafana"):  # dashboards over curator-side data: loopback only
        assert all(p.startswith("127.0.0.1:") for p in services[name].get("ports", [])), name


def test_compose_grafana_provisioning(compose):
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert (DEPLOY / "grafana" / "provisioning").is_dir() and "./grafana/provisioning" in mounts
    target = mounts["./grafana/dpstream-dashboard.json"]
    provider = read_yaml(DEPLOY / "grafana/provisioning/dashboards/dpstream.yml")["providers"][0]
    assert Path(target).parent == Path(provider["options"]["path"])
    ds = read_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"


def test_prometheus_config_is_valid():
    out = subprocess.run([_promtool(), "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# -- Kubernetes -----------------------------------------------------------------------------------------
def test_k8s_objects_have_required_fields(k8s):
    kinds = {d["kind"] for d in k8s}
    assert {"Namespace", "ConfigMap", "Deployment", "StatefulSet", "Service"} <= kinds
    kustomization = read_yaml(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted({d["__file"] for d in k8s})
    for d in k8s:
        where = f"{d['__file']}: {d.get('kind')}"
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), where
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"]), where
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "dpstream", where
        if d["kind"] in WORKLOADS:
            assert d["apiVersion"] == "apps/v1", where
            spec = d["spec"]
            labels = spec["template"]["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= labels.items(), where
            pod = spec["template"]["spec"]
            volumes = {v["name"] for v in pod.get("volumes", [])}
            if d["kind"] == "StatefulSet":
                assert spec["serviceName"] in k8s_objects(k8s, "Service"), where
                volumes |= {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
            for c in pod.get("initContainers", []) + pod["containers"]:
                assert c.get("name") and c.get("image"), where
                for m in c.get("volumeMounts", []):
                    assert m["name"] in volumes, f"{where}: volume {m['name']}"
            for v in pod.get("volumes", []):
                if "configMap" in v:
                    assert v["configMap"]["name"] in k8s_objects(k8s, "ConfigMap"), where
        if d["kind"] == "Service":
            assert d["apiVersion"] == "v1"
            pods = [w for w in k8s if w["kind"] in WORKLOADS and
                    d["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
            assert pods, f"{where} {d['metadata']['name']} selects no workload"
            ports = {p.get("name") for w in pods for c in w["spec"]["template"]["spec"]["containers"]
                     for p in c.get("ports", [])}
            for p in d["spec"]["ports"]:
                assert p["targetPort"] in ports, f"{where}: targetPort {p['targetPort']}"


def _dpstream_container(workload) -> dict:
    (c,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["image"].startswith("dpstream:")]
    return c


def test_k8s_config_workers_and_releaser(k8s, tmp_path):
    dep = configmap_deployment(k8s, tmp_path)
    assert dep.production and dep.random.kind == "secure"
    services = k8s_objects(k8s, "Service")
    # broker and Redis are in-cluster Services (host = [pod.]service.namespace.svc...), on a served port
    for url, port_re in ((dep.broker, r"^([^:]+):(\d+)$"), (dep.redis, r"^rediss?://([^:/]+):(\d+)")):
        host, port = re.match(port_re, url).groups()
        parts = host.split(".")
        svc = parts[1] if parts[0].endswith("-0") else parts[0]
        assert svc in services and "dpstream" in parts, url
        assert int(port) in {p["port"] for p in services[svc]["spec"]["ports"]}, url
    workers = k8s_objects(k8s, "Deployment")["dpstream-worker"]
    releaser = k8s_objects(k8s, "StatefulSet")["dpstream-releaser"]
    assert 1 <= workers["spec"]["replicas"] <= dep.topics.partitions
    assert workers["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0  # never above replicas
    assert releaser["spec"]["replicas"] == 1
    assert not any(d["kind"] == "Deployment" and "releaser" in d["metadata"]["name"] for d in k8s)
    for workload, role in ((workers, "worker"), (releaser, "releaser")):
        c = _dpstream_container(workload)
        assert c["args"][:2] == [role, "--config"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        config_path = Path(c["args"][2])
        assert mounts[str(config_path.parent)] == "config" and config_path.name == "dpstream.yaml"
        init = workload["spec"]["template"]["spec"]["initContainers"][0]
        assert init["command"][:2] == ["python", "/opt/dpstream/create_topics.py"]
        assert init["command"][init["command"].index("--config") + 1] == str(config_path)


def _dpstream_workloads(k8s) -> dict[str, dict]:
    return {name: w for name, w in {**k8s_objects(k8s, "Deployment"), **k8s_objects(k8s, "StatefulSet")}.items()
            if name.startswith("dpstream-")}


def test_k8s_metrics_stay_on_loopback_by_default(k8s):
    """The base manifests bind /metrics to loopback, ask nobody to scrape it, and probe it from
    inside the pod (a kubelet httpGet would need a non-loopback bind)."""
    assert set(_dpstream_workloads(k8s)) == {"dpstream-worker", "dpstream-releaser"}
    for name, workload in _dpstream_workloads(k8s).items():
        c = _dpstream_container(workload)
        port = _metrics_port(c["env"])
        assert {e["name"]: e["value"] for e in c["env"]}["DPSTREAM_METRICS_ADDR"] == "127.0.0.1", name
        assert not any(k.startswith("prometheus.io/")
                       for k in workload["spec"]["template"]["metadata"].get("annotations", {})), name
        assert {"name": "metrics", "containerPort": port} in c["ports"]
        probe = c["livenessProbe"]
        assert "httpGet" not in probe and f"http://127.0.0.1:{port}/metrics" in " ".join(probe["exec"]["command"])
    for policy in (d for d in k8s if d["kind"] == "NetworkPolicy"):  # the opt-in brings the one for metrics
        assert all(p["port"] != port for rule in policy["spec"].get("ingress", []) for p in rule.get("ports", []))


def _json_patch(doc, ops: list[dict]):
    """Apply the `add`/`replace` operations of an RFC 6902 patch (all the opt-in uses) to a copy."""
    import copy

    doc = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = op["path"].lstrip("/").split("/")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            assert op["op"] == "replace" and int(last) < len(node), op
            node[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in node, op
            node[last] = op["value"]
    return doc


def test_k8s_metrics_scrape_opt_in_admits_only_prometheus(k8s):
    """deploy/k8s/scraped = base + the metrics-scrape component: 0.0.0.0, scrape annotations, and a
    NetworkPolicy that selects exactly the dpstream pods and admits only Prometheus to the port."""
    comp_dir = K8S / "metrics-scrape"
    comp = read_yaml(comp_dir / "kustomization.yaml")
    assert comp["kind"] == "Component"
    overlay = read_yaml(K8S / "scraped" / "kustomization.yaml")
    assert overlay["resources"] == [".."] and overlay["components"] == ["../metrics-scrape"]
    targets = {(p["target"]["kind"], p["target"]["name"]): p["path"] for p in comp["patches"]}
    workloads = _dpstream_workloads(k8s)
    assert {name for _, name in targets} == set(workloads)
    for (kind, name), patch_file in targets.items():
        workload = workloads[name]
        assert workload["kind"] == kind
        patched = _json_patch(workload, read_yaml(comp_dir / patch_file))
        c = _dpstream_container(patched)
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["DPSTREAM_METRICS_ADDR"] == "0.0.0.0" and set(env) == set(
            e["name"] for e in _dpstream_container(workload)["env"]), name  # replaced the right entry
        port = _metrics_port(c["env"])
        ann = patched["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == port
        assert ann["prometheus.io/path"] == "/metrics"
    (policy,) = [yaml.safe_load((comp_dir / r).read_text()) for r in comp["resources"]]
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"]["namespace"] == "dpstream"
    (expr,) = policy["spec"]["podSelector"]["matchExpressions"]
    assert expr["operator"] == "In" and set(expr["values"]) == {
        w["spec"]["template"]["metadata"]["labels"][expr["key"]] for w in workloads.values()}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert rule["from"] and all(src.get("podSelector", {}).get("matchLabels") and
                                src.get("namespaceSelector", {}).get("matchLabels") for src in rule["from"])


def test_k8s_redis_persists_every_write(k8s):
    redis = k8s_objects(k8s, "StatefulSet")["redis"]
    assert redis["spec"]["replicas"] == 1
    (c,) = redis["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "always"
    claims = {t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]}
    data_dir = args[args.index("--dir") + 1]
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]}[data_dir] in claims


def test_k8s_kafka_is_kraft_without_auto_created_topics(k8s):
    kafka = k8s_objects(k8s, "StatefulSet")["kafka"]
    (c,) = kafka["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert {m["mountPath"] for m in c["volumeMounts"]} == {env["KAFKA_LOG_DIRS"], "/etc/kafka/secrets", "/etc/kafka/jaas"}


def test_configs_of_compose_and_k8s_agree(compose, k8s, tmp_path):
    """The same deployment apart from where the services are."""
    a = load_config(compose_config_path(compose, "worker")).model_dump(exclude={"broker", "redis"})
    b = configmap_deployment(k8s, tmp_path).model_dump(exclude={"broker", "redis"})
    assert a == b


# -- Grafana dashboard ---------------------------------------------------------------------------------
def dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "dpstream-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_schema_and_metric_names():
    dash = json.loads((DEPLOY / "grafana" / "dpstream-dashboard.json").read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    assert dash["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    declared = metric_names()
    used = set()
    for p in dash["panels"]:
        assert p["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}, p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy") and g["x"] + g["w"] <= 24, p["title"]
        assert p["targets"] and len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            names = set(re.findall(r"\b(dpstream_[a-zA-Z0-9_]+)", t["expr"]))
            assert names, t["expr"]
            assert names <= declared, f"{t['expr']}: {sorted(names - declared)} not in pipeline.stream.process.metrics"
            used |= names
    # The dashboard shows public values only (docs/privacy.md, metrics policy): every series it
    # reads equals something on the public topics; the operational ones stay in Prometheus.
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in used}
    assert families <= PUBLIC_SERIES, sorted(families - PUBLIC_SERIES)
    assert not re.search(r"\bup\b", " ".join(dashboard_exprs()))
    for family in ("dpstream_open_step", "dpstream_privacy_spent_rho", "dpstream_privacy_spent_epsilon",
                   "dpstream_heavy_hitters", "dpstream_released_step"):
        assert family in families, family


def test_dashboard_promql_is_valid(tmp_path):
    """Every expression parses (promtool checks each as a recording rule)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# -- topic creation, for real ----------------------------------------------------------------------------
def test_create_topics_script_against_the_broker(tmp_path):
    from kafka import KafkaAdminClient

    from pipeline.stream.local.embedded import EmbeddedServices
    from pipeline.stream.kafka.topics import topic_names, topic_partitions

    cfg = yaml.safe_load((DEPLOY / "config" / "dpstream.yaml").read_text())
    with EmbeddedServices() as services:
        cfg.update(broker=services.broker.bootstrap, redis=services.redis.url, name="deploy-topics")
        cfg.pop("security")  # the embedded services speak neither TLS nor SASL (tests/test_security_servers.py)
        path = tmp_path / "dpstream.yaml"
        path.write_text(yaml.safe_dump(cfg))
        script = [sys.executable, str(DEPLOY / "create_topics.py"), "--config", str(path)]
        for _ in range(2):  # idempotent
            out = subprocess.run(script, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr
        dep = load_config(path)
        admin = KafkaAdminClient(bootstrap_servers=services.broker.bootstrap)
        try:
            described = {d.get("name", d.get("topic")): len(d["partitions"])
                         for d in admin.describe_topics(list(topic_names(dep).values()))}
        finally:
            admin.close()
        parts = topic_partitions(dep)
        assert described == {name: parts[t] for t, name in topic_names(dep).items()}
        # the same deployment with another partition count is refused, not silently run
        cfg["topics"]["partitions"] = dep.topics.partitions + 1
        path.write_text(yaml.safe_dump(cfg))
        out = subprocess.run(script, capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "partitions" in out.stderr


def test_ensure_topics_waits_for_the_broker_up_to_its_timeout(tmp_path):
    """The admin client's bootstrap retries until ``timeout`` and then fails (no endless loop)."""
    import time

    from kafka.errors import KafkaError

    from pipeline.stream.local.embedded import free_port
    from pipeline.stream.kafka.topics import ensure_topics

    dep = load_config(DEPLOY / "config" / "dpstream.yaml")
    started = time.monotonic()
    with pytest.raises(KafkaError):
        ensure_topics(f"127.0.0.1:{free_port()}", dep, timeout=1.5)
    assert 1.0 <= time.monotonic() - started < 30


def test_metrics_bind_address_follows_the_environment():
    """The default is loopback; a deployment that opts in sets DPSTREAM_METRICS_ADDR=0.0.0.0."""
    from pipeline.stream.local.embedded import free_port

    def listening(addr_env: str | None) -> str:
        port = free_port()
        env = {"DPSTREAM_METRICS_ADDR": addr_env} if addr_env else {}
        code = ("import sys, time; from pipeline.stream.process.metrics import serve_metrics; "
                f"serve_metrics({port}); print('up', flush=True); time.sleep(30)")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env={**__import__("os").environ, **env})
        try:
            assert proc.stdout.readline().strip() == "up"
            for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.split(":")[1], 16) == port:  # 0A = LISTEN
                    return local.split(":")[0]
            return ""
        finally:
            proc.kill()
            proc.wait()

    assert listening(None) == "0100007F"        # 127.0.0.1
    assert listening("0.0.0.0") == "00000000"


def test_brokers_accept_what_the_clients_may_send(compose, k8s):
    """The deployed broker's message.max.bytes is the clients' limit (producers' max_request_size,
    consumers' fetch size): before, the producers allowed 8 MB and the broker 2 MB."""
    from pipeline.stream.process.limits import DEAD_LETTER_COPY_BYTES, MAX_MESSAGE_BYTES, MAX_REPORT_BYTES

    kafka = k8s_objects(k8s, "StatefulSet")["kafka"]
    (c,) = kafka["spec"]["template"]["spec"]["containers"]
    for env in (compose["services"]["kafka"]["environment"], {e["name"]: e["value"] for e in c["env"]}):
        assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) == MAX_MESSAGE_BYTES
    assert DEAD_LETTER_COPY_BYTES < MAX_REPORT_BYTES <= MAX_MESSAGE_BYTES
