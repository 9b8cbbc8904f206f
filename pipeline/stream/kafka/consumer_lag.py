"""The consumer-lag gauge ``dpstream_consumer_lag{topic, partition}`` (declared with the other series in
:mod:`pipeline.stream.process.metrics`): log end offsets against the groups' committed offsets, read
with kafka-python's admin client and consumer."""

from __future__ import annotations

import logging
import threading
from typing import Any

from pipeline.connections import kafka_security
from pipeline.stream.kafka.topics import LAG_ROLE, TOPICS, consumer_groups
from pipeline.stream.process.metrics import METRICS

__all__ = ["ConsumerLagMonitor", "start_lag_monitor"]

log = logging.getLogger("dpstream.metrics")


class ConsumerLagMonitor(threading.Thread):
    """Sets ``dpstream_consumer_lag{topic, partition}`` = log end offset − the group's committed
    offset (the whole log while nothing is committed), every ``interval`` seconds.

    The log end of a topic in ``readable`` (one this process may fetch) is the true one
    (:class:`pipeline.stream.kafka.log_end.LogEnds`: the embedded broker's ListOffsets answer is short by the
    rest of the last record batch). Every other topic's end comes from offset requests only (ListOffsets,
    which needs Describe, never Read): the releaser measures the workers' lag on ``reports`` without being
    able to fetch a raw report. On the embedded broker that end, and so the lag, can read short by the
    rest of the last batch; on Kafka it is exact.

    Run it in one process per deployment (the releaser), or every process exports the same series.
    The jobs commit their handled positions every 2 s, so the lag reads up to 2 s' worth high under load.
    """

    def __init__(
        self,
        bootstrap: str,
        groups: dict[str, list[str]],
        interval: float = 5.0,
        readable: frozenset[str] | set[str] = frozenset(),
    ):
        super().__init__(name="dpstream-consumer-lag", daemon=True)
        self.bootstrap = bootstrap
        self.groups = groups
        self.readable = frozenset(readable)
        self.interval = interval
        self._stop = threading.Event()
        self._admin = self._consumer = None
        self._ends: Any = None  # a LogEnds once connected

    def _clients(self):
        if self._admin is None:
            from kafka import KafkaAdminClient, KafkaConsumer

            from pipeline.stream.kafka.log_end import LogEnds

            self._admin = KafkaAdminClient(
                bootstrap_servers=self.bootstrap, **kafka_security(), client_id="dpstream-lag"
            )
            self._consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                **kafka_security(),
                enable_auto_commit=False,
                client_id="dpstream-lag",
            )
            self._ends = LogEnds(self.bootstrap, client_id="dpstream-lag-ends")
        return self._admin, self._consumer

    def poll_once(self) -> dict[tuple[str, int], int]:
        from kafka import TopicPartition

        admin, consumer = self._clients()
        lags: dict[tuple[str, int], int] = {}
        for group, topics in self.groups.items():
            committed = _committed_offsets(admin, group)
            tps = [
                TopicPartition(t, p)
                for t in topics
                for p in sorted(consumer.partitions_for_topic(t) or ())
            ]
            fetched = [tp for tp in tps if tp.topic in self.readable]
            listed = [tp for tp in tps if tp.topic not in self.readable]
            ends = {
                **(self._ends(fetched) if fetched else {}),
                **(consumer.end_offsets(listed) if listed else {}),
            }
            for tp, end in ends.items():
                meta = committed.get(tp)
                done = meta.offset if meta is not None and meta.offset >= 0 else 0
                lags[(tp.topic, tp.partition)] = max(0, end - done)
        for (topic, partition), lag in lags.items():
            METRICS.consumer_lag.labels(topic, str(partition)).set(lag)
        return lags

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as err:  # a broker hiccup must not kill the process; retry next round
                log.warning("consumer lag poll failed: %s", err)
                self._close_clients()
            self._stop.wait(self.interval)
        self._close_clients()

    def _close_clients(self) -> None:
        for client in (self._consumer, self._admin, self._ends):
            if client is not None:
                try:
                    client.close()
                except Exception:
                    pass
        self._admin = self._consumer = self._ends = None

    def stop(self) -> None:
        self._stop.set()


def _committed_offsets(admin, group: str) -> dict:
    """The group's committed offsets: kafka-python 3 renamed the admin call."""
    if hasattr(admin, "list_group_offsets"):
        return admin.list_group_offsets({group: None}).get(group, {})
    return admin.list_consumer_group_offsets(group)


def start_lag_monitor(runtime, interval: float = 5.0) -> ConsumerLagMonitor | None:
    """Start the lag monitor for a ``Runtime`` (both consumer groups), if metrics are served."""
    if not runtime.metrics_port:
        return None
    # the releaser's process: it fetches its own topics, and only lists the offsets of the workers' ones
    readable = {runtime.names[name] for name, t in TOPICS.items() if LAG_ROLE in t.readers}
    monitor = ConsumerLagMonitor(
        runtime.broker,
        consumer_groups(runtime.deployment, runtime.names),
        interval,
        readable=readable,
    )
    monitor.start()
    return monitor
