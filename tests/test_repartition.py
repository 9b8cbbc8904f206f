"""The repartition protocol on IngestCore, with in-memory logs standing in for the broker (the same
protocol through real processes and the embedded broker: tests/test_stream_any_producer.py).

Two cores own one reports partition each, as two workers would. Reports go to the wrong partition
(as a CRC32 or random partitioner puts them); forwarded batches and forwarded-through markers are
appended to the in-memory ``repartition`` logs and fed back. What breaks these tests: a close that
does not wait for the other sources' markers (forwarded reports imputed), a replay whose copies are
applied twice or dead-lettered, an outcome that depends on how direct and forwarded reports
interleave (a replay would then publish a different partial).
"""

from __future__ import annotations

import numpy as np
import orjson

from pipeline.config import parse_config
from pipeline.serialization import loads_state
from pipeline.stream.ingest.core import ApplyResult, CloseOutput, IngestCore, Record
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.ingest.repartition import (FORMAT_HEADER, POSITIONS_HEADER, ROWS, SOURCE_HEADER,
                                                ForwardMarkers)
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore
from support.stores import WritableStore
from pipeline.stream.kafka.topics import topic_names

P, N = 2, 40


def deployment():
    return parse_config({
        "name": "rep", "topics": {"partitions": P}, "roster": {"size": N}, "horizon": 4,
        "attributes": {"pov": {"type": "binary"}, "status": {"type": "categorical", "values": ["a", "b", "c"]}},
        "budget": {"rho": 1.0}, "random": {"kind": "seeded", "seed": 3},
        "releases": [{"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.5},
                     {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5}],
    })


class Logs:
    """In-memory partitions of ``reports`` and ``repartition`` with increasing offsets."""

    def __init__(self):
        self.reports = [[] for _ in range(P)]
        self.repartition = [[] for _ in range(P)]

    @staticmethod
    def _append(log, value, headers=()):
        log.append(Record(len(log), value, tuple(headers)))

    def report(self, partition, user, step, pov, status="b"):
        self._append(self.reports[partition],
                     orjson.dumps({"user": user, "step": step, "values": {"pov": pov, "status": status}}))

    def close(self, step):
        for log in self.reports:
            self._append(log, orjson.dumps({"step": step, "closed_at": 1000 * step}), [(CONTROL_HEADER, b"close")])


class Worker:
    """One core owning one partition; ``pump`` hands it what its logs hold past its positions."""

    def __init__(self, dep, roster, partition, store=None):
        self.core = IngestCore(dep, roster, topic_names(dep), store=store)
        self.p = partition
        self.store = store
        self.at = self.core.assign(partition)
        self.rat = self.core.inboxes[partition].resume()
        self.dead, self.partials, self.accepted = [], {}, 0

    def pump(self, logs: Logs, publish=True) -> bool:
        reports, forwarded = logs.reports[self.p][self.at:], logs.repartition[self.p][self.rat:]
        self.at += len(reports)
        self.rat += len(forwarded)
        if forwarded:
            assert self.core.enqueue_forwarded(self.p, forwarded) is None
        if reports:
            assert self.core.enqueue(self.p, reports) is None
        outs = self.core.drain_all(self.p)
        for out in outs:
            if isinstance(out, ApplyResult):
                self.accepted += out.accepted
                self.dead += out.dead_letters
                for p, value, headers in out.forwards:
                    logs._append(logs.repartition[p], value, headers)
            elif isinstance(out, ForwardMarkers):
                for p, value, headers in out.messages:
                    logs._append(logs.repartition[p], value, headers)
            elif isinstance(out, CloseOutput) and out.checkpoint:
                chunks = [loads_state(v) for _, v in out.messages]
                self.partials[out.step] = loads_state(b"".join(c["data"].tobytes() for c in chunks))
                if publish and self.store is not None:
                    self.store.save_checkpoint(self.p, out.checkpoint)
        return bool(outs)


def run(workers, logs, rounds=20):
    for _ in range(rounds):
        if not any([w.pump(logs) for w in workers]):
            return


def owner_of(roster):
    return roster.owners(P)


def panel(seed, steps):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2, size=(N, steps)), rng.choice(["a", "b", "c"], size=(N, steps))


def produce(logs, roster, X, S, step, where):
    """Every user's report of ``step`` on partition ``where(row)``."""
    for i, uid in enumerate(roster.ids):
        logs.report(where(i), uid, step, int(X[i, step - 1]), str(S[i, step - 1]))


def closed_values(worker, step):
    part = worker.partials[step]
    return part["reported"], part["users"]


def reference_partials(dep, roster, X, S, steps):
    """Every report sent to its owner (what murmur2-keyed producers do): the partials to reproduce."""
    logs, owners = Logs(), owner_of(roster)
    workers = [Worker(dep, roster, p) for p in range(P)]
    for t in steps:
        produce(logs, roster, X, S, t, lambda i: int(owners[i]))
        logs.close(t)
        run(workers, logs)
    assert all(not logs.repartition[p] or all(r.headers and dict(r.headers).get(CONTROL_HEADER) for r in
                                              logs.repartition[p]) for p in range(P))  # markers only
    return [w.partials for w in workers], workers


def same_partials(a, b):
    for wa, wb in zip(a, b):
        assert sorted(wa) == sorted(wb)
        for step in wa:
            assert orjson.dumps(wa[step], option=orjson.OPT_SERIALIZE_NUMPY) == \
                orjson.dumps(wb[step], option=orjson.OPT_SERIALIZE_NUMPY), step


def test_every_report_on_the_wrong_partition_is_counted_before_its_step_closes():
    dep, roster = deployment(), Roster.from_range(N)
    X, S = panel(1, 3)
    ref, ref_workers = reference_partials(dep, roster, X, S, (1, 2, 3))
    owners = owner_of(roster)
    logs = Logs()
    workers = [Worker(dep, roster, p) for p in range(P)]
    for t in (1, 2, 3):
        produce(logs, roster, X, S, t, lambda i: 1 - int(owners[i]))  # every report on the wrong partition
        logs.close(t)
        workers[0].pump(logs)  # partition 0 reaches the marker first: it must wait for partition 1's forwards
        assert t not in workers[0].partials
        run(workers, logs)
    same_partials([w.partials for w in workers], ref)
    for w in workers:
        assert w.dead == []
        assert w.accepted == sum(closed_values(w, t)[0] for t in (1, 2, 3)) == 3 * int((owners == w.p).sum())
        assert w.core.states[w.p].intake_summary()["history"]["1"]["forwarded"] == int((owners != w.p).sum())


def test_replays_of_source_and_owner_apply_every_report_once(redis_client):
    """The source crashes after forwarding (before its checkpoint) and replays; the owner crashes
    after applying forwarded reports and replays from its checkpoint: no report lost, none applied
    or dead-lettered twice, the partials equal the run without crashes."""
    dep, roster = deployment(), Roster.from_range(N)
    X, S = panel(2, 3)
    ref, _ = reference_partials(dep, roster, X, S, (1, 2, 3))
    store = WritableStore(redis_client, dep.name)
    owners = owner_of(roster)
    rng = np.random.default_rng(5)
    where = rng.integers(0, P, size=(N, 3))  # a random partitioner
    logs = Logs()
    workers = [Worker(dep, roster, p, store) for p in range(P)]
    produce(logs, roster, X, S, 1, lambda i: int(where[i, 0]))
    logs.close(1)
    run(workers, logs)
    produce(logs, roster, X, S, 2, lambda i: int(where[i, 1]))
    for w in workers:  # forwarded and applied, step 2 open
        w.pump(logs)
        w.pump(logs)
    assert any(len(logs.repartition[p]) > P for p in range(P))
    workers = [Worker(dep, roster, p, store) for p in range(P)]  # both crash: restart from step 1's checkpoints
    assert all(w.core.states[w.p].closed == 1 for w in workers)
    logs.close(2)
    produce(logs, roster, X, S, 3, lambda i: int(where[i, 2]))
    logs.close(3)
    run(workers, logs)
    same_partials([{t: w.partials[t] for t in (2, 3)} for w in workers], [{t: r[t] for t in (2, 3)} for r in ref])
    assert all(w.dead == [] for w in workers)
    assert sum(w.accepted for w in workers) == 2 * N  # steps 2 and 3, once each after the restart
    assert sum(closed_values(w, t)[0] for w in workers for t in (2, 3)) == 2 * N


def test_direct_report_wins_over_a_forwarded_one_whatever_the_interleaving():
    """Two different reports for one (user, step) in the same interval, one direct, one forwarded:
    the direct one is applied and the other dead-lettered as a duplicate, in either arrival order,
    so a replay (which may interleave the logs differently) closes the step with the same value."""
    dep, roster = deployment(), Roster.from_range(N)
    owners = owner_of(roster)
    user = roster.ids[int(np.flatnonzero(owners == 0)[0])]
    results = []
    for forwarded_first in (True, False):
        logs = Logs()
        workers = [Worker(dep, roster, p) for p in range(P)]
        logs.report(1, user, 1, pov=0)  # on the wrong partition: forwarded to 0
        if forwarded_first:
            workers[1].pump(logs)
            workers[0].pump(logs)
        logs.report(0, user, 1, pov=1)  # direct
        logs.close(1)
        run(workers, logs)
        row = int(np.flatnonzero(workers[0].core.states[0].rows == roster.row(user))[0])
        results.append(int(workers[0].core.states[0].last_x["pov"][row]))
        (letter,) = workers[0].dead
        assert dict(letter[2])["dpstream-reason"] == b"duplicate"
        assert orjson.loads(letter[1])["values"]["pov"] == 0  # the forwarded report lost
        assert workers[0].accepted == 1
        assert workers[0].core.states[0].intake_summary()["history"]["1"]["rejected"] == {"duplicate": 1}
    assert results == [1, 1]


def _old_format_batch(roster, source, users, step, pov, status, offsets):
    """A forwarded batch as the previous version wrote it: a JSON columnar batch, no format header."""
    value = orjson.dumps({"columns": {"user": [roster.ids[u] for u in users], "step": step, "pov": pov,
                                      "status": status}})
    positions = np.stack([np.asarray(offsets), np.full(len(users), -1)]).astype("<i8")
    return value, [(SOURCE_HEADER, str(source).encode()), (POSITIONS_HEADER, positions.tobytes())]


def test_forwarded_batches_carry_the_owners_rows_and_batches_of_the_previous_format_still_count():
    """A forward is packed rows (the owner neither parses JSON nor looks ids up); a JSON columnar batch
    left in ``repartition`` by the previous version (a checkpoint of it resumes before it) is applied
    too, and its copies skipped by the same source positions."""
    dep, roster = deployment(), Roster.from_range(N)
    owners = owner_of(roster)
    mine = np.flatnonzero(owners == 0)
    logs = Logs()
    workers = [Worker(dep, roster, p) for p in range(P)]
    for u in mine[:3]:
        logs.report(1, roster.ids[u], 1, pov=1, status="c")  # forwarded by this version
    workers[1].pump(logs)
    (rec,) = logs.repartition[0]
    assert dict(rec.headers)[FORMAT_HEADER] == ROWS
    packed = np.frombuffer(rec.value, dtype=workers[1].core.forwarder.dtype)
    assert packed["row"].tolist() == mine[:3].tolist() and packed["step"].tolist() == [1, 1, 1]
    assert packed["a1"].tolist() == [2, 2, 2]  # status "c": its code, not its label
    old = _old_format_batch(roster, 1, mine[3:6], 1, [0, 1, 0], ["a", "b", "a"], [10, 11, 12])
    logs._append(logs.repartition[0], *old)
    logs._append(logs.repartition[0], *old)  # a copy (the old source replayed): skipped
    workers[0].pump(logs)
    assert workers[0].dead == [] and workers[0].accepted == 6
    state = workers[0].core.states[0]
    local = state.local[mine[:6]]
    assert state.pending["pov"][0, local].tolist() == [1, 1, 1, 0, 1, 0]
    assert state.pending["status"][0, local].tolist() == [2, 2, 2, 0, 1, 0]


def test_a_forged_or_garbled_forwarded_batch_is_dead_lettered_whole_and_changes_nothing():
    dep, roster = deployment(), Roster.from_range(N)
    owners = owner_of(roster)
    mine, theirs = np.flatnonzero(owners == 0), np.flatnonzero(owners == 1)
    core = Worker(dep, roster, 0).core
    dtype = core.forwarder.dtype

    def batch(rows, step=1, pov=1, status=0):
        packed = np.zeros(len(rows), dtype=dtype)
        packed["row"], packed["step"], packed["a0"], packed["a1"] = rows, step, pov, status
        return packed.tobytes()

    headers = [(SOURCE_HEADER, b"1"), (FORMAT_HEADER, ROWS)]
    bad = [batch(theirs[:2]),  # users another partition owns
           batch([N + 5]),  # not a roster row
           batch(mine[:1], step=5),  # beyond the horizon
           batch(mine[:1], pov=2),  # out of domain
           batch(mine[:1], pov=-1, status=-1),  # nothing reported
           batch(mine[:2])[:-1],  # not a whole number of rows
           b""]
    records = [Record(i, value, tuple(headers)) for i, value in enumerate(bad)]
    records.append(Record(len(bad), batch(mine[:1]), tuple(headers)))  # a good one after them
    assert core.enqueue_forwarded(0, records) is None
    outs = core.drain_forwarded(0)
    letters = [letter for out in outs for letter in out.dead_letters]
    assert [key for key, _, _ in letters] == [f"repartition:0:{i}:-".encode() for i in range(len(bad))]
    assert all(dict(h)["dpstream-reason"] == b"malformed" and value == bad[i]
               for i, (_, value, h) in enumerate(letters))
    assert sum(out.accepted for out in outs) == 1
    assert (core.states[0].pending["pov"] >= 0).sum() == 1
