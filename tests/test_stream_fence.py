"""A restart never releases a step twice and never continues state under another calibration.

* The fence: release steps, wipe Redis, restart a worker (it re-ingests and re-publishes the partials
  of the released steps) and the releaser against the same broker: the releaser exits with code 4
  and a message saying the state was lost; no manifest is published again.
* The configuration fingerprint: a state created for a heavy-hitter release with k = 3 and method
  tct, window 3, a seeded source, is refused (exit code 2, each changed key named) by a releaser and
  a worker configured with k = 20, method naive, window 2, or production: true.
* The persistent embedded Redis of ``dpstream up`` keeps the state across a stop and a start
  (released steps, ledger, identity; the releases come back to the new memory-only broker);
  ``--ephemeral`` does not.

Real embedded broker and Redis, real worker and releaser processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import load_config, parse_config
from pipeline.connections import redis_client as connect_redis
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.releaser.fence import ReleaseStamp, check_fence, read_release_stamps, unknown_releases
from pipeline.stream.state.fingerprint import config_changes, fingerprint, portable_fingerprint, privacy_config
from pipeline.stream.state.identity import ConfigurationChanged, StateLost, establish_identity
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore, StepRecord
from support.stores import WritableStore
from jobs.eval.testbed import binary_panel

N, T = 600, 4
EXIT_CONFIG, EXIT_STATE_LOST = 2, 4  # docs/operations.md, "Exit codes"

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


def base_config(name: str, services=None) -> dict:
    """A binary fixed-window + cumulative pair and a tct heavy-hitter release on a categorical attribute."""
    cfg = {
        "name": name, "roster": {"size": N}, "horizon": T, "topics": {"partitions": 2},
        "attributes": {"pov": {"type": "binary"},
                       "occ": {"type": "categorical", "values": ["a", "b", "c", "d", "e"], "description": "job"}},
        "budget": {"rho": 0.5, "epsilon": 1.0, "delta": 1e-6},
        "random": {"kind": "seeded", "seed": 5},
        "releases": [
            {"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 3, "share": 0.5},
            {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5},
            {"name": "hh", "type": "heavy_hitters", "attribute": "occ", "method": "tct", "k": 3, "share": 1.0},
        ],
    }
    if services is not None:
        cfg.update(broker=services.broker.bootstrap, redis=services.redis.url)
    return cfg


def write(tmp_path, cfg: dict, suffix: str = "") -> Path:
    path = Path(tmp_path) / f"{cfg['name']}{suffix}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def edited(cfg: dict, release: str | None = None, **changes) -> dict:
    """A copy of ``cfg`` with ``changes`` applied to release ``release`` (or to the top level)."""
    out = json.loads(json.dumps(cfg))
    if release is None:
        out.update(changes)
    else:
        next(r for r in out["releases"] if r["name"] == release).update(changes)
    return out


def reports(t: int, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + t)
    return {"pov": binary_panel(seed, N, T)[:, t - 1], "occ": rng.integers(0, 5, size=N)}


def log_text(tmp_path, name: str) -> str:
    return (Path(tmp_path) / "logs" / f"{name}.log").read_text(errors="replace")


def run_jobs(runs: dict, timeout: float = 60) -> dict:
    """Run ``{label: (role, config)}`` at once (each a process that reads the state and exits: they
    share nothing to wait for), each given ``timeout`` s; ``{label: CompletedProcess}``."""
    started = {label: subprocess.Popen([sys.executable, "-m", "pipeline.cli", role, "--config", str(config)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
               for label, (role, config) in runs.items()}
    done = {}
    try:
        for label, proc in started.items():
            out, err = proc.communicate(timeout=timeout)
            done[label] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


# -- the fingerprint (no services) --------------------------------------------------------------------
def test_fingerprint_names_each_privacy_relevant_change_and_ignores_the_rest():
    cfg = base_config("fp")
    ids = Roster.from_config(parse_config(cfg).roster).ids
    doc = privacy_config(parse_config(cfg), ids)

    def changes(new_cfg, new_ids=ids):
        return config_changes(doc, privacy_config(parse_config(new_cfg), new_ids))

    assert changes(cfg) == []
    assert changes(edited(cfg, "hh", k=20)) == ["releases.hh.k: 3 -> 20"]
    assert changes(edited(cfg, "hh", method="naive")) == ['releases.hh.method: "tct" -> "naive"']
    assert changes(edited(cfg, "fw", window=2)) == ["releases.fw.window: 3 -> 2"]
    # a state created under the relation an earlier version allowed is refused under today's
    assert config_changes(dict(doc, neighbours="add_remove"), doc) == ['neighbours: "add_remove" -> "replace"']
    assert changes(edited(cfg, horizon=5)) == ["horizon: 4 -> 5"]
    assert "budget.epsilon: 1.0 -> 2.0" in changes(edited(cfg, budget={"rho": 0.5, "epsilon": 2.0, "delta": 1e-6}))
    assert "plan.hh.epsilon: 1.0 -> 2.0" in changes(edited(cfg, budget={"rho": 0.5, "epsilon": 2.0, "delta": 1e-6}))
    assert changes(edited(cfg, random={"kind": "secure"})) == ['random.kind: "seeded" -> "secure"']
    occ6 = edited(cfg, attributes={**cfg["attributes"], "occ": {"type": "categorical",
                                                                "values": ["a", "b", "c", "d", "e", "f"]}})
    assert changes(occ6) == ['attributes.occ.values: ["a", "b", "c", "d", "e"] -> ["a", "b", "c", "d", "e", "f"]']
    # same size, other ids: the rows the state is indexed by are other people
    other = changes(cfg, [f"x{i}" for i in range(N)])
    assert len(other) == 1 and other[0].startswith("roster.sha256: ")
    # the checkpoints are per partition (rows by murmur2 modulo the count): another count is refused
    assert changes(edited(cfg, topics={"partitions": 3})) == ["topics.partitions: 2 -> 3"]
    # not privacy-relevant: topic names, step closing, seed value, descriptions
    unchanged = edited(cfg, topics={"partitions": 2, "prefix": "other"}, steps={"close": "deadline", "deadline_seconds": 60}, random={"kind": "seeded", "seed": 9})
    unchanged["attributes"]["occ"]["description"] = "occupation"
    assert changes(unchanged) == []
    # a rename keeps the portable fingerprint (the cross-deployment registry recognises it)
    renamed = privacy_config(parse_config(edited(cfg, name="fp-renamed")), ids)
    assert fingerprint(renamed) != fingerprint(doc) and portable_fingerprint(renamed) == portable_fingerprint(doc)


def test_identity_refuses_changes_seeded_state_in_production_and_repeats(redis_client, monkeypatch):
    cfg = base_config("ident")
    dep = parse_config(cfg)
    ids = Roster.from_config(dep.roster).ids
    store = StateStore(redis_client, dep.name)
    first = establish_identity(dep, ids, store, "releaser")
    assert establish_identity(dep, ids, store, "worker") == first  # unchanged: the same identity
    with pytest.raises(ConfigurationChanged, match=r"releases\.hh\.k: 3 -> 20.*releases\.hh\.method"):
        establish_identity(parse_config(edited(cfg, "hh", k=20, method="naive")), ids, store, "worker")
    prod = parse_config(edited(cfg, production=True, random={"kind": "secure"}))
    with pytest.raises(ConfigurationChanged, match="'seeded' \\(non-secure\\) random source; production: true"):
        establish_identity(prod, ids, store, "releaser")
    assert store.identity()["instance"] == first.instance  # refusals write nothing

    # a renamed copy over the same roster: a warning, refused under production unless accepted
    renamed = parse_config(edited(cfg, name="ident-renamed"))
    establish_identity(renamed, ids, StateStore(redis_client, renamed.name), "releaser")
    prod_a = parse_config(edited(cfg, name="prod-a", production=True, random={"kind": "secure"}))
    establish_identity(prod_a, ids, StateStore(redis_client, prod_a.name), "releaser")
    prod_b = parse_config(edited(cfg, name="prod-b", production=True, random={"kind": "secure"}))
    store_b = StateStore(redis_client, prod_b.name)
    with pytest.raises(StateLost, match="'prod-a' has the same roster and privacy configuration"):
        establish_identity(prod_b, ids, store_b, "releaser")
    assert store_b.identity() is None
    monkeypatch.setenv("DPSTREAM_ACCEPT_NEW_SPEND", "1")
    assert establish_identity(prod_b, ids, store_b, "releaser").instance != first.instance

    # released steps without an identity record (deleted): nothing can be checked
    redis_client.delete(store.keys.identity)
    WritableStore(redis_client, dep.name).commit_step(StepRecord(1, {"fw": b"r1"}, None), {})
    WritableStore(redis_client, dep.name).commit_step(StepRecord(2, {"fw": b"r2"}, None), {})
    with pytest.raises(StateLost, match="2 released step\\(s\\).*no identity record"):
        establish_identity(dep, ids, store, "releaser")
    # a worker cannot read the releaser's pointers; it looks for the workers' own state
    WritableStore(redis_client, dep.name).save_intake({0: {"accepted": 1}})
    with pytest.raises(StateLost, match="workers' intake counts and checkpoints.*no identity record"):
        establish_identity(dep, ids, store, "worker")


def test_fence_logic():
    stamps = [ReleaseStamp("cu", 1, "a"), ReleaseStamp("cu", 2, "a"), ReleaseStamp("fw", 2, None)]
    assert unknown_releases(stamps, "a", 2) == []
    assert unknown_releases(stamps, "a", 1) == stamps[1:]  # restored from an older backup
    assert unknown_releases(stamps, "b", 0) == stamps  # wiped: a new instance knows nothing
    assert unknown_releases(stamps, "b", 2) == stamps[:2]  # another instance's manifests
    check_fence(stamps, "a", 2, "t")
    with pytest.raises(StateLost, match=r"t already holds 2 release manifest\(s\).*steps 1\.\.2, instance\(s\) a"):
        check_fence(stamps, "b", 2, "t")


# -- through the stream -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def test_wiped_redis_restart_is_fenced(tmp_path):
    """Release steps 1-2, wipe Redis, restart the worker (no checkpoint: it re-ingests the log and
    re-publishes step 1's partials, which a releaser without the fence would release again with fresh
    noise) and the releaser: it exits with code 4 and publishes nothing."""
    with EmbeddedServices() as svc:  # its own Redis: the flush must not touch other tests' state
        path = write(tmp_path, base_config("fence-wipe", svc))
        dep = load_config(path)
        with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names)
            for t in (1, 2):
                drv.producer.send_step(t, reports(t))
                drv.close(t)
            drv.shutdown()
            releases_topic = cluster.names["releases"]
            before = asyncio_run(read_release_stamps(cluster.broker, releases_topic))
            assert sorted((s.release, s.step) for s in before) == [(r, t) for r in ("cu", "fw", "hh") for t in (1, 2)]
            instance = StateStore.from_url(svc.redis.url, dep.name).identity()["instance"]
            assert {s.instance for s in before} == {instance}

            cluster.kill("releaser")
            cluster.kill("worker-0")
            connect_redis(svc.redis.url).flushall()  # the admin login of the embedded Redis (its generated password)
            logged = len(log_text(tmp_path, "worker-0"))
            cluster.spawn("worker", "worker-0")  # waits for the identity only the releaser writes
            cluster.spawn("releaser", "releaser")
            assert cluster.wait_exit("releaser", timeout=60) == EXIT_STATE_LOST
            deadline = time.monotonic() + 60
            while "closed step 1" not in log_text(tmp_path, "worker-0")[logged:]:  # re-closed after the wipe
                assert time.monotonic() < deadline, "the restarted worker did not re-close step 1"
                time.sleep(0.3)
            text = log_text(tmp_path, "releaser")
            assert "state lost: refusing to release" in text and f"{releases_topic} already holds 6" in text
            assert "Restore the Redis state from a backup" in text
            after = asyncio_run(read_release_stamps(cluster.broker, releases_topic))
            assert after == before  # no manifest published again
            assert StateStore.from_url(svc.redis.url, dep.name).ledger() == {}  # nothing spent again


def test_edited_configuration_is_refused_by_releaser_and_worker(services, tmp_path):
    """State created by a real run (step 1 released) for hh k = 3 tct and fw window 3, seeded; restarts
    with each edit are refused before touching anything; the unchanged configuration then goes on."""
    cfg = base_config("fence-edit", services)
    path = write(tmp_path, cfg)
    dep = load_config(path)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names)
        drv.producer.send_step(1, reports(1))
        drv.close(1)
        drv.shutdown()
    store = StateStore.from_url(services.redis.url, dep.name)
    state = (store.identity(), store.ledger(), store.last_released())
    assert state[2] == 1

    cases = {
        "k": (edited(cfg, "hh", k=20), ["releases.hh.k: 3 -> 20"]),
        "method": (edited(cfg, "hh", method="naive"), ['releases.hh.method: "tct" -> "naive"']),
        "window": (edited(cfg, "fw", window=2), ["releases.fw.window: 3 -> 2"]),
        # the checkpoints hold each partition's rows: restored under 3 partitions they would be other users'
        "partitions": (edited(cfg, topics={"partitions": 3}), ["topics.partitions: 2 -> 3"]),
    }
    prod_path = write(tmp_path, edited(cfg, production=True, random={"kind": "secure"}), "-prod")
    runs = {(label, role): (role, write(tmp_path, new_cfg, f"-{label}"))
            for label, (new_cfg, _) in cases.items() for role in ("releaser", "worker")}
    runs.update({("prod", role): (role, prod_path) for role in ("releaser", "worker")})
    for (label, role), proc in run_jobs(runs).items():
        assert proc.returncode == EXIT_CONFIG, (label, role, proc.stderr[-2000:])
        if label == "prod":
            assert "'seeded' (non-secure) random source" in proc.stderr, proc.stderr
        else:
            named = cases[label][1]
            assert "configuration refused" in proc.stderr and all(n in proc.stderr for n in named), proc.stderr
    assert (store.identity(), store.ledger(), store.last_released()) == state  # refusals changed nothing

    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs2") as cluster:  # unchanged: goes on
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        drv.producer.send_step(2, reports(2))
        drv.close(2)
        drv.shutdown()
    assert store.last_released() == 2


def asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


# -- dpstream up: persistent embedded Redis -----------------------------------------------------------------
def _dpstream(*args, env, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, (args, proc.stderr[-2000:])
    return proc.stdout


def _cumulative_step_1(path: Path, env: dict, timeout: float = 60) -> list[int]:
    """Release cu's counts of step 1 as read back from the running deployment's topics."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "query", "--config", str(path), "--release", "cu",
                               "--step", "1", "--json"], capture_output=True, text=True, env=env, timeout=timeout)
        if proc.returncode == 0:
            return json.loads(proc.stdout)["at_least"]
        assert time.monotonic() < deadline, proc.stderr[-2000:]
        time.sleep(0.5)


def _up_release_and_stop(path: Path, env: dict, tmp_path, flags: tuple[str, ...], step: int | None) -> dict:
    """Start `dpstream up`, optionally release ``step``, return the status, stop it."""
    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up", "--config", str(path), "--workers", "1",
                           "--log-dir", str(tmp_path / "logs"), *flags], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        banner = up.stdout.readline()
        assert "dpstream up: broker" in banner, banner
        if step is not None:
            _dpstream("produce", "--simulate", "--config", str(path), "--step", str(step), env=env)
            _dpstream("close", "--config", str(path), "--step", str(step), env=env)
        deadline = time.monotonic() + 60
        while True:
            status = json.loads(_dpstream("status", "--config", str(path), "--json", env=env))
            if step is None or status["published_step"] >= step or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if status["released_step"]:
            status["cu_step_1"] = _cumulative_step_1(path, env)
        return {"banner": banner, **status}
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)


def test_up_keeps_embedded_redis_unless_ephemeral(tmp_path):
    cfg = base_config("fence-up")
    cfg["releases"] = cfg["releases"][:2]
    cfg["budget"] = {"rho": 0.5}
    cfg["attributes"] = {"pov": {"type": "binary"}}
    path = write(tmp_path, cfg)
    home = tmp_path / "home"
    env = dict(os.environ, DPSTREAM_HOME=str(home), PYTHONUNBUFFERED="1")

    first = _up_release_and_stop(path, env, tmp_path, (), step=1)
    assert first["released_step"] == 1 and f"data in {home / 'fence-up' / 'redis'}" in first["banner"]
    redis_dir = home / "fence-up" / "redis"
    assert redis_dir.is_dir() and (redis_dir.stat().st_mode & 0o777) == 0o700
    assert (home / "fence-up").stat().st_mode & 0o777 == 0o700
    second = _up_release_and_stop(path, env, tmp_path, (), step=None)
    assert second["released_step"] == 1 and second["ledger"] == first["ledger"]
    assert second["cu_step_1"] == first["cu_step_1"]  # republished to the new broker, not redrawn
    assert second["instance"] == first["instance"] and second["fingerprint"] == first["fingerprint"]

    eph = _up_release_and_stop(path, env, tmp_path, ("--ephemeral",), step=1)
    assert "ephemeral: deleted on stop" in eph["banner"] and eph["released_step"] == 1
    again = _up_release_and_stop(path, env, tmp_path, ("--ephemeral",), step=None)
    assert again["released_step"] == 0 and again["ledger"] == {}  # nothing kept
    assert len({first["instance"], eph["instance"], again["instance"]}) == 3


def test_a_state_of_another_key_layout_is_refused_naming_the_key(redis_client):
    """Layout 1 (every key flat under the prefix, a shared fingerprint hash) wrote an identity record without a
    layout: a process of this version refuses it with exit code 4 (docs/streaming.md, "State format")."""
    import json

    dep = parse_config(base_config("layout"))
    ids = Roster.from_config(dep.roster).ids
    store = StateStore(redis_client, dep.name)
    current = establish_identity(dep, ids, store, "releaser")
    assert store.identity()["layout"] == 2
    old = {k: v for k, v in store.identity().items() if k != "layout"}
    redis_client.set(store.keys.identity, json.dumps(old))
    for role in ("releaser", "worker"):
        with pytest.raises(StateLost, match=f"{role}: dpstream:layout:identity: Redis key layout version 1, this "
                                            "dpstream reads layout 2") as refused:
            establish_identity(dep, ids, store, role)
        assert refused.value.exit_code == 4
    assert current.instance == old["instance"]
