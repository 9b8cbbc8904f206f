"""A lost log is found by its identity (the broker's topic id), not by offsets lining up.

Real embedded broker (memory-only, restarted: every log lost and created again), Redis and worker and
releaser processes. Each test forces the interleaving in which the new log has already grown to the
saved position when the restarted process is assigned, so "the log ends before my offset" is false:

* the releaser: step 2 closed, both partials on the log, the releaser dies before the commit; after
  the restart it re-drives the close, the workers re-send both partials to the new ``step-partials``
  log (offsets 0, 1) and only then is the releaser's consumer assigned (it is stopped with SIGSTOP
  from its re-drive until the partials are there). Its resume offset is 2 = the new log's end:
  seeking there skipped both partials and step 2 was never released. (The releaser group's offset on
  the new broker is set to 2 as well, so that a fetch from the log's start cannot beat the seek.)
* a worker: its checkpoint is at offset c of a reports partition (step 1's close marker); after the
  restart, the reports of steps 2 and 3 (more than c + 1) are on the new log before the worker is
  assigned: resuming at c + 1 skipped step 2's reports, which were imputed instead of counted.
"""

from __future__ import annotations

import signal

import numpy as np

from kafka import TopicPartition

from pipeline.stream.process.faults import FAULT_EXIT_CODE
from pipeline.stream.kafka.log_end import log_ends
from pipeline.stream.kafka.topics import RELEASER, ensure_topics, group_id
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.state.store import StateStore
from support.stream_runs import check_outputs, log_text, run_steps, scenario, wait_until


def _log_end(cluster: LocalCluster, topic: str, partition: int = 0) -> int:
    tp = TopicPartition(cluster.names[topic], partition)
    return log_ends(cluster.broker, [tp], timeout=5)[tp]


def _commit(cluster: LocalCluster, group: str, topic: str, offset: int) -> None:
    """Commit ``offset`` of partition 0 of ``topic`` for consumer group ``group`` (no member running)."""
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=cluster.broker, group_id=group, enable_auto_commit=False)
    try:
        tp = TopicPartition(cluster.names[topic], 0)
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        consumer.close()


def _lose_every_log(svc, cluster: LocalCluster, dep) -> None:
    for name in list(cluster.procs):
        cluster.kill(name)
    svc.broker.stop()
    svc.broker.start()
    ensure_topics(cluster.broker, dep)


def test_releaser_reads_a_replaced_partials_log_that_grew_to_its_resume_offset(tmp_path):
    with EmbeddedServices(data_dir=tmp_path / "svc") as svc:
        path, dep, X, roster = scenario(tmp_path, svc, "lost-log-releaser", seed=31, horizon=3)
        store = StateStore.from_url(svc.redis.url, dep.name)
        cluster = LocalCluster(path, dep, workers=2, log_dir=tmp_path / "logs")
        try:
            cluster.start(releaser_env={"DPSTREAM_FAULT": "releaser.before_commit@2"})
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            run_steps(drv, X, (1,), cluster)
            drv.producer.send_step(2, {"pov": X[:, 1]})
            drv.close(2, wait=False)
            assert cluster.wait_exit("releaser", timeout=60) == FAULT_EXIT_CODE
            wait_until(lambda: _log_end(cluster, "step-partials") >= 4, "the workers did not publish step 2's partials")
            drv.shutdown()
            resume = store.partials_resume()
            assert resume == 2 and store.last_released() == 1 and store.last_closing() == 2

            _lose_every_log(svc, cluster, dep)
            # The group's position before the releaser's own seek is the resume offset too, so where the
            # releaser reads from is decided by its seek alone (from the new log's start, a fetch that
            # beat the seek would read the partials by luck: how the race mostly passed).
            _commit(cluster, group_id(dep, RELEASER), "step-partials", resume)
            releaser = cluster.spawn("releaser", "releaser")
            # stop the releaser once it has re-driven step 2's close: its consumer is assigned only after the
            # workers have re-sent both partials to the new log (offsets 0, 1: its end = the resume offset)
            wait_until(lambda: "close markers of step(s) [2] written again" in log_text(tmp_path, "releaser"),
                  "the releaser did not re-drive step 2's close", timeout=60)
            releaser.send_signal(signal.SIGSTOP)
            this_run = log_text(tmp_path, "releaser")[cluster.log_starts["releaser"]:]
            forced = "reading " + cluster.names["step-partials"] not in this_run
            for i in range(2):
                cluster.spawn("worker", f"worker-{i}")
            wait_until(lambda: _log_end(cluster, "step-partials") >= resume, "the workers did not re-send the partials")
            releaser.send_signal(signal.SIGCONT)
            assert forced, "the releaser was assigned before its re-drive: the interleaving was not forced"

            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            drv.wait_released(2, timeout=60)
            assert "the broker lost or replaced the log" in log_text(tmp_path, "releaser")
            run_steps(drv, X, (3,), cluster, timeout=60)
            drv.shutdown()
            check_outputs(dep, X, drv.panels, store, drv.manifests_seen)
        finally:
            cluster.stop()


def test_worker_reads_a_replaced_reports_log_that_grew_past_its_checkpoint(tmp_path):
    with EmbeddedServices(data_dir=tmp_path / "svc") as svc:
        path, dep, X, roster = scenario(tmp_path, svc, "lost-log-worker", seed=32, horizon=3)
        store = StateStore.from_url(svc.redis.url, dep.name)
        with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            run_steps(drv, X, (1,), cluster)
            drv.shutdown()
            marker = {p: _log_end(cluster, "reports", p) - 1 for p in range(dep.topics.partitions)}

            _lose_every_log(svc, cluster, dep)
            cluster.spawn("releaser", "releaser")
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            half = np.arange(roster.n) % 2 == 0  # step 2 in two messages per partition, then step 3
            for t, present in ((2, half), (2, ~half), (3, None)):
                drv.producer.send_step(t, {"pov": X[:, t - 1]}, present=present)
            drv.producer._producer.flush()
            # the new logs have grown past the checkpoints' close markers before the worker is assigned
            assert all(_log_end(cluster, "reports", p) > marker[p] + 1 for p in marker), marker
            cluster.spawn("worker", "worker-0")
            for t in (2, 3):
                drv.close(t, timeout=60)
            drv.shutdown()
            check_outputs(dep, X, drv.panels, store, drv.manifests_seen)  # step 2 counted, not imputed
            assert "the broker lost or replaced the log" in log_text(tmp_path, "worker-0")
