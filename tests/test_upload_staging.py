"""Workers hold an upload's messages until its commit record (pipeline.stream.ingest.uploads):
applied at the commit's log position, dropped on abort, dead-lettered ``uncommitted`` when the
count is wrong or no end record comes by the second close; kept across a restart (real Redis)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from pipeline.serialization import loads_state
from pipeline.stream.process import limits
from pipeline.stream.ingest.core import Record
from pipeline.stream.ingest import uploads
from pipeline.stream.ingest.uploads import end_record, upload_headers
from support.ingest_log import Log, applies, closes, core_for, deployment, reasons_of, users_of
from support.stores import WritableStore

UP, OTHER = "a" * 32, "b" * 32


class UploadLog(Log):
    def upload(self, upload, user, step, **values) -> Record:
        values = values or {"poverty": 1, "query": 1}
        value = orjson.dumps({"user": user, "step": step, "values": values})
        rec = Record(len(self.records), value, tuple(upload_headers(upload)))
        self.records.append(rec)
        return rec

    def end(self, upload, messages, commit=True) -> Record:
        value, headers = end_record(upload, messages, commit)
        rec = Record(len(self.records), value, tuple(headers))
        self.records.append(rec)
        return rec


def partition_zero():
    """A core holding partition 0, its users, and an empty log."""
    core, roster = core_for(deployment(monitors=False))
    core.assign(0)
    return core, users_of(roster, 0), UploadLog()


def drained(core, log, start=0):
    core.enqueue(0, log.records[start:])
    return core.drain(0)


def accepted(outputs):
    return sum(a.accepted for a in applies(outputs))


def test_an_upload_counts_only_at_its_commit_and_its_dead_letters_name_the_messages():
    core, mine, log = partition_zero()
    log.upload(UP, mine[0], 1)
    log.upload(UP, "nobody", 1)
    held = drained(core, log)
    assert accepted(held) == 0 and not reasons_of(held)
    assert core.states[0].offset == 1  # handled (held), so a restart does not wait for them
    assert core.states[0].intake_summary()["open"].get("1", 0) == 0
    log.end(UP, 2)
    out = drained(core, log, 2)
    assert accepted(out) == 1 and reasons_of(out) == {"unknown_user": 1}
    (letter,) = [d for a in applies(out) for d in a.dead_letters]
    headers = dict(letter[2])
    assert headers["dpstream-source"].decode().endswith("/0/1")  # the message's own offset
    assert core.states[0].offset == 2  # the commit's


def test_an_aborted_upload_is_dropped_and_a_later_end_of_it_ignored():
    core, mine, log = partition_zero()
    log.upload(UP, mine[0], 1)
    log.end(UP, 1, commit=False)
    log.end(UP, 1)  # a commit after the abort finds nothing held
    log.report(mine[0], 1)  # so this is the first report of the user
    out = drained(core, log)
    assert accepted(out) == 1 and not reasons_of(out)
    assert not core.held[0]


def test_a_commit_naming_another_count_uses_none_of_the_upload():
    core, mine, log = partition_zero()
    log.upload(UP, mine[0], 1)
    log.upload(UP, mine[1], 1)
    log.end(UP, 3)
    out = drained(core, log)
    assert accepted(out) == 0 and reasons_of(out) == {"uncommitted": 2}
    details = {dict(d[2])["dpstream-detail"].decode() for a in applies(out) for d in a.dead_letters}
    assert any("names 3 message(s)" in d and "2 were held" in d for d in details), details


def test_the_commit_position_decides_late_and_duplicate():
    core, mine, log = partition_zero()
    log.upload(UP, mine[0], 1)  # before the plain report in the log ...
    log.upload(UP, mine[1], 1)
    log.report(mine[0], 1)  # ... but this one counts first: the upload is not committed yet
    log.marker(1)
    log.upload(OTHER, mine[2], 2)
    log.end(UP, 2)  # after the close of step 1: its reports are late
    log.end(OTHER, 1)
    out = drained(core, log)
    (close,) = closes(out)
    assert close.summary["reported"] == 1
    assert reasons_of(out) == {"late": 2} and accepted(out) == 2  # the plain report; OTHER's step 2


def test_an_upload_never_ended_is_dead_lettered_at_the_second_close():
    core, mine, log = partition_zero()
    log.upload(UP, mine[0], 2)
    log.marker(1)
    out = drained(core, log)
    assert not reasons_of(out) and len(core.held[0]) == 1  # held through one close
    log.marker(2)
    out = drained(core, log, 2)
    assert reasons_of(out) == {"uncommitted": 1} and not core.held[0]
    (close,) = closes(out)
    assert close.summary["reported"] == 0
    kinds = [type(o).__name__ for o in out]
    assert kinds.index("ApplyResult") < kinds.index("CloseOutput")  # acknowledged before its checkpoint


def test_held_uploads_above_the_limit_dead_letter_the_oldest(monkeypatch):
    monkeypatch.setattr(limits, "MAX_HELD_BYTES", 150)
    core, mine, log = partition_zero()
    log.upload(UP, mine[0], 1)
    log.upload(OTHER, mine[1], 1)  # two held messages of ~60 bytes: within the limit
    assert not reasons_of(drained(core, log))
    log.upload(OTHER, mine[2], 1)
    out = drained(core, log, 2)
    assert reasons_of(out) == {"uncommitted": 1}  # UP, the oldest
    assert list(core.held[0]) == [OTHER]


def test_an_upload_with_more_reports_than_ranks_on_a_partition_uses_none_of_them(monkeypatch):
    """A committed report's place in its upload is 24 bits: an uploader other than ``produce``
    that commits more reports on one partition has the whole upload dead-lettered, not numbered
    past the limit (the limit lowered to 2 reports, so 3 small messages are counted)."""
    monkeypatch.setattr(uploads, "MAX_UPLOAD_REPORTS", 2)
    core, mine, log = partition_zero()
    for user in mine[:3]:
        log.upload(UP, user, 1)
    log.end(UP, 3)
    out = drained(core, log)
    assert accepted(out) == 0 and reasons_of(out) == {"uncommitted": 3}
    letters = [dict(d[2]) for a in applies(out) for d in a.dead_letters]
    assert all(b"more than 2 of its reports" in h["dpstream-detail"] for h in letters)
    for user in mine[3:5]:  # as many as the ranks number: applied
        log.upload(OTHER, user, 1)
    log.end(OTHER, 2)
    assert accepted(drained(core, log, 4)) == 2


def test_a_message_too_large_to_parse_takes_no_rank_of_its_upload(monkeypatch):
    """Reports of a message above MAX_REPORT_BYTES are never parsed (the message is dead-lettered
    ``too_large``): they do not count toward the rank limit (lowered to 2; the message limit to
    150 bytes, so a batch of 3 reports is too large and a single report is not)."""
    from pipeline.stream.ingest import core as ingest_core

    monkeypatch.setattr(uploads, "MAX_UPLOAD_REPORTS", 2)
    monkeypatch.setattr(limits, "MAX_REPORT_BYTES", 150)
    monkeypatch.setattr(ingest_core, "MAX_REPORT_BYTES", 150)
    core, mine, log = partition_zero()
    single = {"user": mine[0], "step": 1, "values": {"poverty": 1, "query": 1}}
    batch = {"columns": {"user": mine[1:4], "step": 1, "poverty": [1, 1, 1], "query": [1, 1, 1]}}
    for seq, value in enumerate([orjson.dumps(single), orjson.dumps(batch) + b" " * 80]):
        assert (len(value) > 150) == (seq == 1)
        log.records.append(Record(len(log.records), value, tuple(upload_headers(UP, seq))))
    log.end(UP, 2)
    out = drained(core, log)
    assert accepted(out) == 1 and reasons_of(out) == {"too_large": 1}


def test_the_dry_run_drops_an_upload_with_more_reports_than_ranks_as_the_workers_do(monkeypatch):
    """The dry run (pipeline.held_reports) reads the log as the workers take it: an upload
    committed with more reports on a partition than its ranks number counts nothing."""
    from pipeline.held_reports import HeldReports, _Closes, _PartitionReader, _Span
    from pipeline.stream.ingest.roster import Roster

    monkeypatch.setattr(uploads, "MAX_UPLOAD_REPORTS", 2)
    dep = deployment(monitors=False)
    roster = Roster.from_range(dep.n)
    mine = users_of(roster, 0)
    log = UploadLog()
    for user in mine[:3]:
        log.upload(UP, user, 1)
    log.end(UP, 3)
    for user in mine[3:5]:
        log.upload(OTHER, user, 1)
    log.end(OTHER, 2)
    held = HeldReports(closing=0, rows={1: np.zeros(dep.n, dtype=bool)})
    reader = _PartitionReader(dep, roster, held, _Closes(None, {}), _Span(0, 0, None))
    for rec in log.records:
        reader.add(rec.value, rec.headers, rec.offset)
    reader.flush()
    assert sorted(roster.ids[r] for r in np.flatnonzero(held.rows[1])) == sorted(mine[3:5])


def test_held_messages_survive_a_restart_in_the_checkpoint(redis_client):
    dep = deployment(monitors=False)
    mine = None
    log = UploadLog()

    def run(core):
        core.enqueue(0, log.records)
        return core.drain(0)

    ref, roster = core_for(dep)
    ref.assign(0)
    mine = users_of(roster, 0)
    log.upload(UP, mine[0], 2, poverty=0)
    log.upload(UP, mine[1], 2)
    log.marker(1)  # the checkpoint of this close holds the two messages
    log.report(mine[2], 2)
    log.end(UP, 2)
    log.marker(2)
    expected = closes(run(ref))

    store = WritableStore(redis_client, dep.name)
    a, _ = core_for(dep, store=store)
    a.assign(0)
    a.enqueue(0, log.records[:3])
    (close1,) = closes(a.drain(0))
    assert set(loads_state(close1.checkpoint)["uploads"]) == {UP}
    store.save_checkpoint(0, close1.checkpoint)
    del a
    b, _ = core_for(dep, store=WritableStore(redis_client, dep.name))
    assert b.assign(0) == 3  # after the marker: the held messages come from the checkpoint
    out = run(b)
    assert accepted(out) == 3
    (close2,) = closes(out)
    assert close2.summary == expected[1].summary and close2.summary["reported"] == 3
    assert close2.messages == expected[1].messages
    assert "uploads" not in loads_state(close2.checkpoint)


@pytest.mark.parametrize("bad", [b"", b"{}", b'{"messages": -1}', b'{"messages": true}'])
def test_a_commit_without_a_valid_count_is_not_a_commit(bad):
    core, roster = core_for(deployment(monitors=False))
    core.assign(0)
    log = UploadLog()
    log.upload(UP, users_of(roster, 0)[0], 1)
    _, headers = end_record(UP, 1, True)
    log.records.append(Record(1, bad, tuple(headers)))
    out = drained(core, log)
    assert accepted(out) == 0 and reasons_of(out) == {"uncommitted": 1}


def test_a_committed_correction_ranks_by_its_commit_not_by_its_message():
    """Corrections of one log: the later one wins. A held upload's correction is at its commit's
    position, so it beats a correction sent after its message but before its commit."""
    from pipeline.stream.ingest.corrections import REPLACE_HEADER

    core, roster = core_for(deployment(monitors=False))
    core.assign(0)
    user = users_of(roster, 0)[0]
    fix = (REPLACE_HEADER, b"1")
    log = UploadLog()

    def report(poverty, headers):
        value = orjson.dumps({"user": user, "step": 1, "values": {"poverty": poverty, "query": 1}})
        log.records.append(Record(len(log.records), value, headers))

    report(1, (*upload_headers(UP), fix))  # offset 0, committed at 2
    report(0, (fix,))  # offset 1: a correction of the same (user, step), applied at once
    log.end(UP, 1)
    out = drained(core, log)
    assert accepted(out) == 2 and not reasons_of(out)
    local = int(np.flatnonzero(roster.rows_of(0, 3) == roster.ids.index(user))[0])
    assert core.states[0].pending["poverty"][0, local] == 1  # the upload's value: committed later


def _random_log(roster, rng) -> UploadLog:
    """Plain reports, uploads (committed, aborted, never ended, a wrong count) interleaved with
    the close markers of steps 1..3, on partition 0 (some users owned by other partitions)."""
    log = UploadLog()
    users = users_of(roster, 0) + users_of(roster, 1)[:3]
    open_uploads: dict[str, int] = {}
    step = 1
    for _ in range(160):
        roll = rng.random()
        if roll < 0.03 and step <= 3:
            log.marker(step)
            step += 1
        elif roll < 0.35:
            log.report(str(rng.choice(users)), int(rng.integers(1, 5)), poverty=int(rng.integers(2)))
        elif roll < 0.8 or not open_uploads:
            upload = f"{int(rng.integers(6)):032x}"
            if upload in open_uploads or rng.random() < 0.5:
                log.upload(upload, str(rng.choice(users)), int(rng.integers(1, 5)))
                open_uploads[upload] = open_uploads.get(upload, 0) + 1
        else:
            upload = str(rng.choice(sorted(open_uploads)))
            n = open_uploads.pop(upload)
            fate = rng.random()
            if fate < 0.7:
                log.end(upload, n)
            elif fate < 0.85:
                log.end(upload, n, commit=False)
            else:
                log.end(upload, n + 1)
    while step <= 3:
        log.marker(step)
        step += 1
    return log


def test_a_restart_at_any_close_reproduces_every_close_with_uploads_held(redis_client):
    """The state at each close, its partial and the dead letters do not depend on where the worker
    stopped: held messages travel in the checkpoint, positions come from the log."""
    dep = deployment(monitors=False)
    for seed in range(4):
        ref, roster = core_for(dep)
        ref.assign(0)
        log = _random_log(roster, np.random.default_rng(seed))
        ref.enqueue(0, log.records)
        expected_out = ref.drain_all(0)
        expected = [(c.step, c.messages) for c in closes(expected_out)]
        letters = sorted(d[0] for a in applies(expected_out) for d in a.dead_letters)
        assert [s for s, _ in expected] == [1, 2, 3]
        markers = [r.offset for r in log.records if r.headers and r.headers[0][1] == b"close"]
        for stop in range(len(markers)):  # a crash right after close `stop`'s checkpoint
            store = WritableStore(redis_client, f"{dep.name}-{seed}-{stop}")
            a, _ = core_for(dep, store=store)
            a.assign(0)
            a.enqueue(0, log.records[: markers[stop] + 1])
            first = a.drain_all(0)
            (last,) = [c for c in closes(first) if c.step == stop + 1]
            store.save_checkpoint(0, last.checkpoint)
            b, _ = core_for(dep, store=store)
            assert b.assign(0) == markers[stop] + 1
            b.enqueue(0, log.records)
            second = b.drain_all(0)
            got = [(c.step, c.messages) for c in closes(first) + closes(second)]
            assert got == expected, (seed, stop)
            again = sorted(d[0] for a in applies(first + second) for d in a.dead_letters)
            assert again == letters, (seed, stop)


def test_numbered_messages_a_copy_held_once_and_applied_in_number_order():
    """A retried send may store a message twice or after a later one: numbered messages
    (``dpstream-upload-seq``) are held once each and applied by number."""
    core, mine, log = partition_zero()

    def numbered(seq, user, poverty):
        value = orjson.dumps({"user": user, "step": 1, "values": {"poverty": poverty, "query": 1}})
        log.records.append(Record(len(log.records), value, tuple(upload_headers(UP, seq))))

    numbered(1, mine[0], 1)  # stored before message 0
    numbered(0, mine[0], 0)
    numbered(1, mine[0], 1)  # a copy of message 1
    numbered(2, mine[1], 1)
    log.end(UP, 3)
    out = drained(core, log)
    # message 0 first: its report of mine[0] is accepted, message 1's is the duplicate
    assert accepted(out) == 2 and reasons_of(out) == {"duplicate": 1}
    (letter,) = [d for a in applies(out) for d in a.dead_letters]
    assert dict(letter[2])["dpstream-source"].decode().endswith("/0/0")  # message 1, stored first


def test_a_numbered_upload_missing_a_number_uses_none_of_it():
    core, mine, log = partition_zero()
    for seq in (0, 2):
        value = orjson.dumps({"user": mine[seq], "step": 1, "values": {"poverty": 1, "query": 1}})
        log.records.append(Record(len(log.records), value, tuple(upload_headers(UP, seq))))
    log.end(UP, 2)  # two messages held, but not numbered 0 and 1
    out = drained(core, log)
    assert accepted(out) == 0 and reasons_of(out) == {"uncommitted": 2}


def test_a_dead_letter_of_a_held_batch_message_counts_its_reports():
    """One dead letter per held message, but the counts (intake, `dpstream dead-letters`) are of
    reports: a batch message of three reports counts three."""
    from pipeline.dead_letters import summarise

    core, mine, log = partition_zero()
    columns = {"user": mine[:3], "step": 1, "poverty": [0, 1, 0], "query": [1, 1, 1]}
    log.records.append(Record(0, orjson.dumps({"columns": columns}), tuple(upload_headers(UP, 0))))
    log.upload(UP, mine[3], 1)  # unnumbered: one report
    log.end(UP, 5)  # a wrong count
    out = drained(core, log)
    assert reasons_of(out) == {"uncommitted": 4}
    letters = [d for a in applies(out) for d in a.dead_letters]
    assert [dict(h).get("dpstream-reports") for _, _, h in letters] == [b"3", None]

    class Letter:
        def __init__(self, headers):
            self.headers = headers

    assert summarise([Letter(h) for _, _, h in letters])["uncommitted"].count == 4
