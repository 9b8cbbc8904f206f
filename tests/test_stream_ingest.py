"""IngestCore: per-partition backlog, close markers, feedback gating, replay, checkpoints (real Redis)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.ingest.core import CloseOutput, IngestCore, Record, is_marker
from pipeline.stream.ingest.reports import REASONS
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.kafka.topics import topic_names
from pipeline.stream.state.keys import Keys
from support.ingest_log import MARK, PARTS, Log, applies, closes, core_for, deployment, users_of
from support.stores import WritableStore


def feedback(release, step, flagged=()):
    return orjson.dumps({"release": release, "step": step, "flagged": list(flagged)})


def decode_partial(out: CloseOutput):
    """One partition's partial from its chunk messages (chunk order as published)."""
    chunks = [loads_state(value) for _, value in out.messages]
    assert [c["chunk"] for c in chunks] == list(range(len(chunks)))
    assert {(c["step"], c["partition"], c["chunks"]) for c in chunks} == {(out.step, out.partition, len(chunks))}
    return loads_state(b"".join(c["data"].tobytes() for c in chunks))


def test_is_marker():
    assert is_marker(MARK)
    assert not is_marker(((CONTROL_HEADER, b"open"),)) and not is_marker(()) and not is_marker(None)


def test_reports_then_marker_close_with_checkpoint():
    dep = deployment(monitors=False)
    core, roster = core_for(dep)
    assert core.assign(0) == 0  # no checkpoint: replay from the beginning of the log
    log = Log()
    mine = users_of(roster, 0)
    for u in mine[:3]:
        log.report(u, 1)
    log.marker(1)
    log.report(mine[0], 2, poverty=0)
    core.enqueue(0, log.records)
    out = core.drain(0)
    assert [type(o).__name__ for o in out] == ["ApplyResult", "CloseOutput", "ApplyResult"]
    assert out[0].accepted == 3 and not out[0].dead_letters
    close = out[1]
    assert close.step == 1 and close.partition == 0 and close.summary["reported"] == 3
    assert close.summary["users"] == len(mine)
    state = loads_state(close.checkpoint)
    assert state["offset"] == 3 and state["closed"] == 1  # the checkpoint is at the marker
    part = decode_partial(close)
    assert part["step"] == 1 and part["users"] == len(mine)
    assert part["releases"]["cu"]["z"][1] == 3
    assert core.states[0].offset == 4 and core.drain(0) == []


def test_drain_waits_for_feedback_and_other_partitions_proceed():
    dep = deployment(monitors=True)
    core, roster = core_for(dep)
    logs = {}
    for p in range(PARTS):
        core.assign(p)
        log = logs[p] = Log()
        u = users_of(roster, p)
        log.report(u[0], 1, query=4)
        log.marker(1)
        log.report(u[1], 2, query=4)
        log.marker(2)
        log.report(u[2], 3, query=4)
        core.enqueue(p, log.records)
    out0 = core.drain(0)
    assert [o.step for o in closes(out0)] == [1]  # step 2 waits for step 1's feedback
    assert sum(a.accepted for a in applies(out0)) == 2  # the report before the blocked marker is applied
    assert core.feedback_outstanding(0)
    assert core.drain(0) == []  # still waiting: nothing happens, nothing is lost
    # another partition goes ahead meanwhile
    out1 = core.drain(1)
    assert [o.step for o in closes(out1)] == [1]
    # feedback releases partition 0 only
    assert core.apply_feedback(0, feedback("hh", 1, [4])) is True
    assert core.apply_feedback(0, feedback("hh", 1, [4])) is False  # duplicate feedback
    assert core.states[0].aggregators["hh"].charges.sum() == 1
    out0 = core.drain(0)
    assert [o.step for o in closes(out0)] == [2]
    assert sum(a.accepted for a in applies(out0)) == 1  # the step-3 report after marker 2
    assert core.backlog[0] == []
    assert core.feedback_outstanding(0) and core.feedback_outstanding(1)
    assert len(core.backlog[1]) == 2  # marker 2 and what follows are still queued for partition 1


def test_feedback_for_unassigned_partition_is_ignored():
    dep = deployment()
    core, _ = core_for(dep)
    assert core.apply_feedback(2, feedback("hh", 1, [1])) is False


def test_replayed_records_are_skipped():
    dep = deployment(monitors=False)
    core, roster = core_for(dep)
    core.assign(1)
    log = Log()
    u = users_of(roster, 1)
    log.report(u[0], 1)
    log.report(u[1], 1)
    log.marker(1)
    log.report(u[2], 2)
    core.enqueue(1, log.records)
    first = core.drain(1)
    assert len(closes(first)) == 1
    # at-least-once delivery: the whole log again, plus one new record
    log.report(u[3], 2)
    core.enqueue(1, log.records)
    assert [r.offset for r in core.backlog[1]] == [4]
    again = core.drain(1)
    assert not closes(again)
    assert sum(a.accepted for a in applies(again)) == 1
    assert not any(a.dead_letters for a in applies(again))  # no spurious duplicates


def test_duplicate_marker_resends_the_kept_partial_and_writes_no_checkpoint():
    """A marker of a step already closed (the releaser re-drives closes it has not released: the broker
    may have lost the partials) re-sends the partial byte for byte, also from a restored checkpoint, and
    never checkpoints or recomputes; only the last KEEP_PARTIALS closed steps are kept."""
    dep = deployment(monitors=False)
    core, roster = core_for(dep)
    core.assign(0)
    log = Log()
    log.marker(1)
    log.marker(1)
    core.enqueue(0, log.records)
    out = closes(core.drain(0))
    assert out[0].messages and out[0].checkpoint
    assert out[1].messages == out[0].messages and out[1].checkpoint == b"" and out[1].summary.get("duplicate")
    assert core.states[0].closed == 1 and core.states[0].offset == 1

    class Checkpoints:  # what the worker reads back on assignment
        keys = Keys(dep.name)

        def load_checkpoint(self, partition):
            return out[0].checkpoint

        def load_kept_partials(self, partition, steps):  # written beside the checkpoint, in one transaction
            return {t: out[0].kept[t] for t in steps if t in out[0].kept}

    restored = IngestCore(dep, roster, topic_names(dep), store=Checkpoints(), isolated=True)
    assert restored.assign(0) == 1
    assert restored.enqueue(0, [Record(1, orjson.dumps({"step": 1}), MARK)]) is None
    resent = closes(restored.drain(0))
    assert [o.messages for o in resent] == [out[0].messages] and resent[0].checkpoint == b""
    assert restored.states[0].closed == 1


def test_without_feedback_only_the_last_keep_partials_closed_steps_are_kept():
    dep = deployment(monitors=False)
    core, _ = core_for(dep)
    core.assign(0)
    log = Log()
    for t in range(1, 6):
        log.marker(t)
    core.KEEP_PARTIALS = 3
    core.enqueue(0, log.records)
    outs = closes(core.drain(0))
    assert sorted(core.kept[0]) == [3, 4, 5]
    assert [sorted(o.kept) for o in outs] == [[1], [2], [3], [4], [5]]  # each written once, at its close
    assert [o.dropped for o in outs] == [[], [], [], [1], [2]]


def test_feedback_proves_a_step_released_and_drops_its_kept_partial(caplog):
    """The releaser publishes a step's feedback only after committing the step to Redis, and re-drives
    only closes after the last committed step: a feedback message of step s drops the kept partials of
    steps up to s, from memory and from Redis with the checkpoint written once the step's feedback is
    complete (with a heavy-hitter release a worker keeps one step's partial at most). A repeated marker of a
    released step re-sends nothing and raises no alarm; feedback of a step not closed here is not
    taken as proof of anything."""
    dep = deployment(monitors=True)
    core, roster = core_for(dep)
    core.assign(0)
    log = Log()
    log.marker(1)
    core.enqueue(0, log.records)
    (first,) = closes(core.drain(0))
    assert sorted(core.kept[0]) == [1] and sorted(first.kept) == [1]
    core.apply_feedback(0, feedback("hh", 7, []))  # not closed here: proves nothing
    assert sorted(core.kept[0]) == [1]
    assert core.apply_feedback(0, feedback("hh", 1, [])) is True
    assert core.kept[0] == {}
    assert list(core.feedback_checkpoints()) == [0] and core.take_dropped(0) == [1]  # deleted from Redis with it
    assert core.take_dropped(0) == []
    log.marker(1)  # a re-driven close of the released step
    log.marker(2)
    core.enqueue(0, log.records[1:])
    with caplog.at_level("INFO", logger="dpstream.worker"):
        again, second = closes(core.drain(0))
    assert again.step == 1 and again.messages == [] and again.checkpoint == b""
    assert "released already" in caplog.text and "no longer kept" not in caplog.text
    assert second.step == 2 and sorted(core.kept[0]) == [2]
    assert sorted(second.kept) == [2] and second.dropped == []


def test_foreign_reports_are_forwarded_to_their_owner_not_rejected():
    """A report of a user another partition owns (a producer not partitioning by murmur2) is
    forwarded to the owner's `repartition` partition with its source position; only real
    rejections are dead-lettered (tests/test_repartition.py follows it to the owner)."""
    dep = deployment(monitors=False)
    core, roster = core_for(dep)
    core.assign(0)
    log = Log()
    foreign_user = users_of(roster, 2)[0]
    mine = users_of(roster, 0)[0]
    log.report(foreign_user, 1)
    log.report(mine, 1)
    batch = log.raw(orjson.dumps({"reports": [
        {"user": mine, "step": 1, "values": {"poverty": 0}},  # duplicate of offset 1
        {"user": foreign_user, "step": 2, "values": {"poverty": 1}},
    ]}))
    core.enqueue(0, log.records)
    (res,) = core.drain(0)
    assert res.accepted == 1 and res.forwarded == 2
    assert res.reasons == {"duplicate": 1}
    ((owner, value, headers),) = res.forwards
    assert owner == 2
    h = dict(headers)
    assert h["dpstream-from"] == b"0"
    positions = np.frombuffer(h["dpstream-positions"], dtype="<i8").reshape(2, -1)
    assert positions.tolist() == [[0, 2], [-1, 1]]  # (offset, row in its message): a single report, a batch row
    # packed rows: the owner's roster row, step and codes (-1: not reported), no JSON to parse again
    assert h["dpstream-format"] == b"rows"
    packed = np.frombuffer(value, dtype=core.forwarder.dtype)
    assert [roster.ids[r] for r in packed["row"].tolist()] == [foreign_user] * 2
    assert packed["step"].tolist() == [1, 2]
    column = {name: packed[f"a{i}"].tolist() for i, name in enumerate(core.forwarder.names)}
    assert column == {"poverty": [1, 1], "query": [1, -1]}
    assert batch.offset == 2 and core.states[0].offset == 2
    assert core.states[0].intake_summary()["forwarded"] == 2
    # state untouched by the foreign reports: nothing pending for the foreign row
    assert core.states[0].pending["poverty"].max(initial=-1) == 1


def test_dead_letter_keys_are_unique_within_a_run():
    dep = deployment(monitors=False)
    core, roster = core_for(dep)
    core.assign(0)
    log = Log()
    for _ in range(5):
        log.raw(b"garbage")
    core.enqueue(0, log.records)
    (res,) = core.drain(0)
    keys = [k for k, _, _ in res.dead_letters]
    assert len(set(keys)) == 5 and all(v == b"garbage" for _, v, _ in res.dead_letters)
    assert res.reasons == {"malformed": 5}


def test_every_dead_letter_reason_is_declared():
    assert set(REASONS) == {"malformed", "unknown_user", "out_of_domain", "duplicate", "late", "future_step"}


def _run_partition(core, partition, log, start_index, feedbacks):
    """Enqueue log.records[start_index:] and drain, applying scripted feedback; return close partials."""
    core.enqueue(partition, log.records[start_index:])
    got = []
    while True:
        out = core.drain(partition)
        for c in closes(out):
            if c.messages:
                got.append((c.step, decode_partial(c)))
        if core.feedback_outstanding(partition):
            step = core.states[partition].closed
            if step in feedbacks:
                core.apply_feedback(partition, feedback("hh", step, feedbacks[step]))
                for p, blob in core.feedback_checkpoints().items():  # stored as the worker job does
                    if core.store is not None:
                        core.store.save_checkpoint(p, blob)
                continue
        if not out:
            return got


def _scripted_log(roster, partition, steps, rng):
    log = Log()
    users = users_of(roster, partition)
    for t in range(1, steps + 1):
        for u in users:
            if rng.random() < 0.8:
                log.report(u, t, poverty=int(rng.integers(0, 2)), query=int(rng.integers(0, 3)))
        log.raw(b"{not json")
        log.marker(t)
    return log


def test_checkpoint_restores_into_new_core_with_redis(redis_client):
    dep = deployment(monitors=True)
    store = WritableStore(redis_client, dep.name)
    rng = np.random.default_rng(8)
    roster = Roster.from_range(dep.n)
    log = _scripted_log(roster, 1, 4, rng)
    fb = {1: [0], 2: [1, 2], 3: [], 4: [0]}

    # reference: one uninterrupted core
    ref, _ = core_for(dep)
    ref.assign(1)
    expected = _run_partition(ref, 1, log, 0, fb)
    assert [s for s, _ in expected] == [1, 2, 3, 4]

    # a worker that closes step 2, stores the checkpoint (as the job does), then dies
    a, _ = core_for(dep, store=store)
    assert a.assign(1) == 0
    a.enqueue(1, log.records)
    markers = [r.offset for r in log.records if r.headers]
    outs = a.drain(1)  # closes step 1, waits for feedback
    for c in closes(outs):
        store.save_checkpoint(c.partition, c.checkpoint)
    a.apply_feedback(1, feedback("hh", 1, fb[1]))  # its checkpoint is due (last feedback of the step)
    for p, blob in a.feedback_checkpoints().items():  # stored as the job does
        store.save_checkpoint(p, blob)
    outs = a.drain(1)
    (c2,) = closes(outs)
    assert c2.step == 2
    store.save_checkpoint(1, c2.checkpoint)
    del a

    # a new worker restores from Redis
    b, _ = core_for(dep, store=WritableStore(redis_client, dep.name))
    resume = b.assign(1)
    assert resume == markers[1] + 1
    assert b.states[1].closed == 2 and b.feedback_outstanding(1)
    assert b.assign(0) == 0  # other partitions have no checkpoint: replay from the start
    # the broker replays from the resume offset (and maybe earlier: enqueue skips those)
    got = _run_partition(b, 1, log, markers[0], fb)
    assert [s for s, _ in got] == [3, 4]
    for (s1, p1), (s2, p2) in zip(expected[2:], got):
        assert s1 == s2
        assert orjson.dumps(_plain(p1)) == orjson.dumps(_plain(p2))
    # after the feedback of step 4 the checkpoint in Redis is the latest state
    blob = store.load_checkpoint(1)
    assert loads_state(blob)["closed"] == 4 and not loads_state(blob)["feedback_needed"]


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


def test_apply_feedback_saves_checkpoint_after_last_feedback(redis_client):
    dep = deployment(monitors=True)
    store = WritableStore(redis_client, dep.name)
    core, roster = core_for(dep, store=store)
    core.assign(2)
    log = Log()
    log.report(users_of(roster, 2)[0], 1, query=5)
    log.marker(1)
    core.enqueue(2, log.records)
    core.drain(2)
    assert store.load_checkpoint(2) is None  # the close's checkpoint is the caller's to store
    assert core.apply_feedback(2, feedback("hh", 1, [5]))
    assert core.feedback_checkpoints().keys() == {2} and core.feedback_checkpoints() == {}  # due once
    core.apply_feedback(2, feedback("hh", 1, [5]))
    assert core.feedback_checkpoints() == {}  # a repeat changes nothing
    store.save_checkpoint(2, core.checkpoint(2))  # as the job does with what feedback_checkpoints hands it
    state = loads_state(store.load_checkpoint(2))
    assert state["closed"] == 1 and state["feedback_needed"] == [] and state["offset"] == 1
    assert state["aggregators"]["hh"]["charges"].sum() == 1


def test_checkpoint_of_another_format_version_is_refused_naming_its_key(redis_client):
    """A checkpoint written by an older dpstream (format 1) is not half-read: assigning its
    partition fails with the Redis key in the message (pipeline.serialization)."""
    from pipeline.serialization import StateFormatError

    dep = deployment(monitors=False)
    store = WritableStore(redis_client, dep.name)
    core, _ = core_for(dep, store=store)
    core.assign(1)
    current = dumps_state(core.states[1].get_state())
    store.save_checkpoint(1, b"DPST1" + current[5:])
    with pytest.raises(StateFormatError, match=f"dpstream:{dep.name}:ingest:checkpoint:1: state format version '1'"):
        core_for(dep, store=store)[0].assign(1)
    store.save_checkpoint(1, current)
    assert core_for(dep, store=store)[0].assign(1) == core.states[1].offset + 1
