"""A batch message whose every report one check rejects (a late step's upload, a batch sent again)
is one dead letter of the message, not one per report (pipeline.stream.ingest.reports,
``ParsedReports.reject``): its bytes, no ``dpstream-batch-index``, ``dpstream-reports`` its report
count, key ``<partition>:<offset>:-``. Counts stay counts of reports (the run's reasons, the
intake, ``dpstream dead-letters``, produce's verdict). A message with any report accepted,
forwarded or rejected for another reason keeps one dead letter per rejected report, and so does
the forwarded path (rejections filed under their source positions).

Before, each of a late batch's N reports was re-encoded into a dead letter of its own: N letters
(and ~1 s of a worker's CPU per 10^5 reports)."""

from __future__ import annotations

import orjson
import pytest

from pipeline.dead_letters import summarise
from pipeline.fates import Receipt, _rejections
from pipeline.stream.ingest.core import IngestCore, Record
from pipeline.stream.ingest.corrections import REPLACE_HEADER
from pipeline.stream.ingest.uploads import end_record, upload_headers
from pipeline.stream.kafka.messages import REPORTS_HEADER
from pipeline.stream.kafka.topics import topic_names
from support.ingest_log import (MARK, PARTS, Log, applies, closes, core_for, deployment,
                                reasons_of, users_of)
from support.loopback import Loopback


def columnar(users, step) -> bytes:
    pov = [i % 2 for i in range(len(users))]
    return orjson.dumps({"columns": {"user": list(users), "step": step, "poverty": pov}})


def rows(users, step) -> bytes:
    """A ``{"reports": [...]}`` batch; ``step``: one for all, or a list of one per user."""
    steps = [step] * len(users) if isinstance(step, int) else step
    return orjson.dumps({"reports": [{"user": u, "step": s, "values": {"poverty": i % 2}}
                                     for i, (u, s) in enumerate(zip(users, steps))]})


def closed_partition():
    """A core holding partition 0 with step 1 closed; its users; the log (the marker at offset 0)."""
    core, roster = core_for(deployment(monitors=False))
    core.assign(0)
    log = Log()
    log.marker(1)
    core.enqueue(0, log.records)
    assert len(closes(core.drain(0))) == 1
    return core, users_of(roster, 0), log


def drained(core, log, start):
    core.enqueue(0, log.records[start:])
    return core.drain(0)


def letters_of(outputs):
    return [d for a in applies(outputs) for d in a.dead_letters]


class Letter:  # what a consumer of the dead-letter topic hands over
    def __init__(self, letter):
        self.key, self.value, self.headers = letter


@pytest.mark.parametrize("encode", [columnar, rows], ids=["columnar", "rows"])
def test_a_late_batch_is_one_dead_letter_counting_all_its_reports(encode):
    core, mine, log = closed_partition()
    value = log.raw(encode(mine, 1)).value
    out = drained(core, log, 1)
    n = len(mine)
    (letter,) = letters_of(out)  # before: one per report
    key, copy, headers = letter
    h = dict(headers)
    assert key == b"0:1:-" and copy == value  # the message itself
    assert h["dpstream-reason"] == b"late" and h[REPORTS_HEADER] == str(n).encode()
    assert "dpstream-batch-index" not in h and h["dpstream-source"].decode().endswith("/0/1")
    assert reasons_of(out) == {"late": n} and sum(a.accepted for a in applies(out)) == 0
    assert core.states[0].intake_summary()["rejected"] == {"late": n}
    assert summarise([Letter(letter)])["late"].count == n  # dpstream dead-letters


def test_a_batch_sent_again_is_one_duplicate_dead_letter():
    core, roster = core_for(deployment(monitors=False))
    core.assign(0)
    mine = users_of(roster, 0)
    log = Log()
    log.raw(columnar(mine, 2))
    log.raw(columnar(mine, 2))  # the same upload again
    out = drained(core, log, 0)
    (letter,) = letters_of(out)
    assert letter[0] == b"0:1:-" and dict(letter[2])["dpstream-reason"] == b"duplicate"
    assert dict(letter[2])[REPORTS_HEADER] == str(len(mine)).encode()
    assert reasons_of(out) == {"duplicate": len(mine)}
    assert sum(a.accepted for a in applies(out)) == len(mine)


def test_a_batch_partly_accepted_or_rejected_for_two_reasons_keeps_a_letter_per_report():
    core, mine, log = closed_partition()
    n = len(mine)
    half = n // 2
    log.raw(rows(mine, [1] * half + [2] * (n - half)))  # late, then accepted for the open step 2
    log.raw(rows(mine[:2], [1, 5]))  # late and future_step: each its own reason
    log.raw(columnar([*mine[:3], "nobody"], 1))  # late, and one the parser rejects
    out = drained(core, log, 1)
    letters = letters_of(out)
    assert all("dpstream-batch-index" in dict(h) for _, _, h in letters)
    assert all(REPORTS_HEADER not in dict(h) for _, _, h in letters)
    assert sorted(k for k, _, _ in letters) == sorted(
        [f"0:1:{i}".encode() for i in range(half)] + [b"0:2:0", b"0:2:1"]
        + [f"0:3:{i}".encode() for i in range(4)])
    assert reasons_of(out) == {"late": half + 1 + 3, "future_step": 1, "unknown_user": 1}
    assert sum(a.accepted for a in applies(out)) == n - half
    # a late row's dead letter is the single report it stands for
    copy = next(v for k, v, _ in letters if k == b"0:3:0")
    assert orjson.loads(copy) == {"user": mine[0], "step": 1, "values": {"poverty": 0}}


def test_a_batch_with_a_report_forwarded_to_its_owner_keeps_a_letter_per_report():
    core, roster = core_for(deployment(monitors=False))
    core.assign(0)
    mine, theirs = users_of(roster, 0), users_of(roster, 1)
    log = Log()
    log.marker(1)
    log.raw(columnar([*mine[:3], theirs[0]], 1))
    out = drained(core, log, 0)
    assert sorted(k for k, _, _ in letters_of(out)) == [b"0:1:0", b"0:1:1", b"0:1:2"]
    assert reasons_of(out) == {"late": 3} and sum(a.forwarded for a in applies(out)) == 1


def test_a_replay_writes_the_same_whole_letter():
    """A worker restarted from the close's checkpoint replays the batch: the same key, value and
    headers (pipeline.fates counts it once)."""
    core, mine, log = closed_partition()
    log.raw(columnar(mine, 1))
    checkpoint = core.checkpoint(0)  # as the close stored it: the batch is not in it
    first = letters_of(drained(core, log, 1))
    restarted = IngestCore(core.deployment, core.roster, core.names,
                           store=_Checkpoints(core, checkpoint), isolated=True)
    assert restarted.assign(0) == 1  # resumes after the marker: the batch again
    again = letters_of(drained(restarted, log, 1))
    assert again == first and len(again) == 1


class _Checkpoints:
    """The close's checkpoint, as a restarted worker reads it on assignment."""

    def __init__(self, core, blob):
        from pipeline.stream.state.keys import Keys

        self.keys, self.blob = Keys(core.deployment.name), blob

    def load_checkpoint(self, partition):
        return self.blob

    def load_kept_partials(self, partition, steps):
        return {}


def test_a_late_upload_is_one_letter_per_message_naming_its_own_offset():
    """A held upload committed after the close: each of its batch messages is judged at the
    commit and dead-lettered whole under its own offset."""
    core, mine, log = closed_partition()
    up = "c" * 32
    half = len(mine) // 2
    for k, part in enumerate((mine[:half], mine[half:])):
        log.records.append(Record(len(log.records), columnar(part, 1),
                                  tuple(upload_headers(up, k))))
    value, headers = end_record(up, 2, True)
    log.records.append(Record(len(log.records), value, tuple(headers)))
    out = drained(core, log, 1)
    letters = letters_of(out)
    assert sorted(k for k, _, _ in letters) == [b"0:1:-", b"0:2:-"]
    assert sorted(int(dict(h)[REPORTS_HEADER]) for _, _, h in letters) == sorted([half, len(mine) - half])
    assert reasons_of(out) == {"late": len(mine)}


def test_a_late_correction_batch_is_one_dead_letter():
    core, mine, log = closed_partition()
    log.records.append(Record(1, columnar(mine, 1), ((REPLACE_HEADER, b"1"),)))
    out = drained(core, log, 1)
    (letter,) = letters_of(out)
    assert letter[0] == b"0:1:-" and dict(letter[2])["dpstream-reason"] == b"late"
    assert reasons_of(out) == {"late": len(mine)}


def test_forwarded_reports_rejected_by_their_owner_keep_a_letter_per_report():
    """A late batch that arrived on a partition not owning its users: the owner files each
    rejection under its source position (offset and row), as before."""
    dep = deployment(monitors=False)
    core = IngestCore(dep, core_for(dep)[1], topic_names(dep))  # not isolated: forwards
    loop = Loopback(core)
    for p in range(PARTS):
        core.assign(p)
        core.enqueue(p, [Record(0, orjson.dumps({"step": 1}), MARK)])
    loop.drain(range(PARTS))
    assert all(core.states[p].closed == 1 for p in range(PARTS))
    mine = users_of(core.roster, 0)[:4]
    core.enqueue(1, [Record(1, columnar(mine, 1))])  # partition 0's users on partition 1
    out = loop.drain([1])
    letters = letters_of(out)
    assert sorted(k for k, _, _ in letters) == [f"1:1:{i}".encode() for i in range(4)]
    assert all(dict(h)["dpstream-reason"] == b"late" for _, _, h in letters)
    assert reasons_of(out) == {"late": 4}


def test_produces_verdict_counts_every_report_of_a_whole_late_letter(monkeypatch):
    """``produce``'s verdict (pipeline.fates) reads the dead letters back: one whole letter of a
    late batch counts all the reports the producer sent in that message."""
    core, mine, log = closed_partition()
    log.raw(columnar(mine, 1))
    log.raw(columnar(mine[:2], 2))  # accepted
    letters = [Letter(d) for d in letters_of(drained(core, log, 1))]
    assert len(letters) == 1

    def read_to_end(broker, topics, handle, timeout, start):
        for letter in letters + letters:  # a restarted worker wrote it again: counted once
            handle(letter)

    monkeypatch.setattr("pipeline.consumer.read_to_end", read_to_end)
    receipt = Receipt(core.names["reports"])
    receipt.add(0, 1, len(mine))
    receipt.add(0, 2, 2)
    got = _rejections("broker", core.names["dead-letter"], core.names["reports"], receipt, {}, {0: 2})
    assert got == {"late": len(mine)}


def test_whole_rejections_build_no_per_report_bytes(monkeypatch):
    """The CPU of a late upload went into re-encoding each report (``ParsedReports.original``):
    a message rejected whole never asks for one."""
    from pipeline.stream.ingest.reports import ParsedReports

    core, mine, log = closed_partition()
    log.raw(columnar(mine, 1))
    log.raw(rows(mine, 1))

    def refuse(self, i):
        raise AssertionError("a report of a message rejected whole was re-encoded")

    monkeypatch.setattr(ParsedReports, "original", refuse)
    out = drained(core, log, 1)
    assert reasons_of(out) == {"late": 2 * len(mine)} and len(letters_of(out)) == 2
