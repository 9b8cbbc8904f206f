"""Drive a running deployment step by step: send reports, close the step, wait for its release.

Used by ``dpstream demo`` and the stream tests. The release latency it measures is from the close
command being acknowledged by the broker to the whole step being readable on the public topics (it
includes the markers, the workers' close, the releaser's work and both hops). The public records'
own timestamps cannot measure it: they carry the step's public close time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson

from pipeline.connections import kafka_security
from pipeline.consumer import PanelStore
from pipeline.releases import kind_of
from pipeline.stream.kafka.report_producer import ReportProducer

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["StepDriver"]


class StepDriver:
    def __init__(
        self,
        bootstrap: str,
        deployment: Deployment,
        roster,
        topic_names: dict[str, str],
        cluster=None,
    ):
        from kafka import KafkaConsumer, TopicPartition

        self.deployment = deployment
        self.names = topic_names
        self.cluster = cluster
        self.producer = ReportProducer(bootstrap, deployment, roster, topic_names)
        self.panels = PanelStore()
        # fetch_max_wait_ms: how long the broker may hold a fetch with nothing new (kafka-python's default
        # 500 ms). The embedded broker does not answer a held fetch when records arrive: a produce ->
        # consume hop took ~215 ms at 500 ms, ~10 ms at 50 ms (as the jobs' consumers), so the step's
        # records waited for the held fetch.
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            **kafka_security(),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=16 << 20,
            fetch_max_bytes=64 << 20,
            fetch_max_wait_ms=50,
        )
        self._handlers = self.panels.handlers(topic_names)
        tps = [TopicPartition(t, 0) for t in self._handlers]
        self._consumer.assign(tps)
        self._consumer.seek_to_beginning(*tps)
        self.manifests_seen: dict[tuple[str, int], int] = {}
        self.timestamps: dict[
            tuple[str, bytes], int
        ] = {}  # (topic, key) -> record timestamp (ms) of the first copy
        self.close_timestamp: dict[
            int, int
        ] = {}  # step -> record timestamp (ms) of its close command

    def poll(self, timeout_ms: int = 100) -> None:
        for tp, msgs in self._consumer.poll(timeout_ms=timeout_ms).items():
            for msg in msgs:
                self.timestamps.setdefault((tp.topic, msg.key), int(msg.timestamp))
                if tp.topic == self.names["releases"]:
                    m = orjson.loads(msg.value)
                    key = (m["release"], int(m["step"]))
                    self.manifests_seen[key] = self.manifests_seen.get(key, 0) + 1
                self._handlers[tp.topic](msg.value)

    def step_complete(self, step: int) -> bool:
        """Every release's step read back: its manifest and synthetic chunks, and for a kind whose output
        is alerts also its alert record (published beside the manifest, so it may arrive after it)."""
        return all(
            rel.name in self.panels.panels
            and step in self.panels.panels[rel.name].complete_steps
            and (kind_of(rel).output != "alerts" or (rel.name, step) in self.panels.alerts)
            for rel in self.deployment.releases
        )

    def wait_released(self, step: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.step_complete(step):
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step} not released within {timeout:.0f} s")
            if self.cluster is not None:
                self.cluster.check_alive()
            self.poll()

    def close(self, step: int, wait: bool = True, timeout: float = 120.0) -> float:
        """Close ``step``; with ``wait``, return the release latency in seconds."""
        started = time.perf_counter()
        self.close_timestamp[step] = self.producer.close_step(step)
        if wait:
            self.wait_released(step, timeout)
        return time.perf_counter() - started

    def shutdown(self) -> None:
        self.producer.close()
        self._consumer.close()
