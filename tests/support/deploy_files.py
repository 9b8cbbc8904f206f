"""The deployment files under deploy/ read as the deploy tests check them: the compose file, the
Kubernetes objects, and the configurations they mount."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"


def read_yaml(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose():
    return read_yaml(DEPLOY / "docker-compose.yml")


@pytest.fixture(scope="module")
def k8s() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                doc["__file"] = path.name
                docs.append(doc)
    return docs


def k8s_objects(k8s, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in k8s if d["kind"] == kind}


def compose_config_path(compose, service: str) -> Path:
    """The host file behind the container path given to --config (through the service's volumes)."""
    svc = compose["services"][service]
    cmd = svc["command"]
    container_path = cmd[cmd.index("--config") + 1]
    for vol in svc.get("volumes", []):
        host, target = vol.split(":")[:2]
        if container_path.startswith(target.rstrip("/") + "/"):
            return (DEPLOY / host / container_path[len(target.rstrip("/")) + 1:]).resolve()
    pytest.fail(f"{service}: {container_path} is not mounted from the repository")


def configmap_deployment(k8s, tmp_path):
    """The Kubernetes ConfigMap's configuration, validated, and equal to the same text loaded from a
    file."""
    cm = k8s_objects(k8s, "ConfigMap")["dpstream-config"]
    data = yaml.safe_load(cm["data"]["dpstream.yaml"])
    dep = parse_config(data, source="configmap dpstream-config")
    dep.budget_plan()
    path = tmp_path / "dpstream.yaml"
    path.write_text(cm["data"]["dpstream.yaml"])
    assert load_config(path) == dep
    return dep
