"""Prometheus metrics of the stream processes (DESIGN §7). Curator-side: never expose publicly.

Each process serves ``/metrics`` on its own port (``DPSTREAM_METRICS_PORT``), bound to
``DPSTREAM_METRICS_ADDR`` (default 127.0.0.1; containers set 0.0.0.0 so Prometheus can reach them).
Metrics carry operational counts only (how many reports, which rejection reasons, latencies,
privacy spent, how many users a monitor retired); no true statistic of the data is exported: no
label names an attribute value, element or histogram bin (``ALLOWED_LABELS``), and no value is a
count of users holding a value.
"""

from __future__ import annotations

import logging
import os
import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = ["METRICS", "ALLOWED_LABELS", "serve_metrics", "metric_names", "consumer_groups",
           "observe_partition", "forget_partition", "ConsumerLagMonitor", "start_lag_monitor"]

log = logging.getLogger("dpstream.metrics")

# Labels a dpstream metric may carry. Every one is public configuration or operational (a status,
# a rejection reason, a partition/topic number, a release name); none can carry data values.
ALLOWED_LABELS = frozenset({"status", "reason", "partition", "release", "topic"})


class _Metrics:
    def __init__(self) -> None:
        self.reports = Counter("dpstream_reports_total", "Reports handled by ingest workers", ["status"])
        self.dead_letters = Counter("dpstream_dead_letters_total", "Reports sent to the dead-letter topic", ["reason"])
        self.open_step = Gauge("dpstream_open_step", "The next step to close, per reports partition", ["partition"])
        self.step_close_seconds = Histogram(
            "dpstream_step_close_seconds", "Worker time to close a step (impute, aggregate, checkpoint)",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.release_seconds = Histogram(
            "dpstream_release_seconds", "Releaser time from last partial received to manifest published",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.released_step = Gauge("dpstream_released_step", "Last released step")
        self.privacy_rho = Gauge("dpstream_privacy_spent_rho", "zCDP budget spent", ["release"])
        self.privacy_epsilon = Gauge("dpstream_privacy_spent_epsilon", "(eps, delta) budget spent", ["release"])
        self.heavy_hitters = Gauge("dpstream_heavy_hitters", "Elements flagged heavy at the last step", ["release"])
        self.retired_users = Counter("dpstream_retired_users_total", "Users retired by charging (k reached)", ["release"])
        self.retired_users_now = Gauge(
            "dpstream_partition_retired_users", "Users of a reports partition no longer counted by a charging release",
            ["release", "partition"])
        self.padding_clamps = Counter(
            "dpstream_padding_clamped_bins_total", "Projected counts clamped because the padding was too small",
            ["release"])
        self.budget_refusals = Counter("dpstream_budget_refusals_total", "Releases refused: budget exhausted", ["release"])
        self.republished = Counter("dpstream_republished_steps_total", "Steps republished from their stored record")
        self.consumer_lag = Gauge("dpstream_consumer_lag", "Messages behind the log end", ["topic", "partition"])

    def all(self):
        return [m for m in vars(self).values() if hasattr(m, "_name")]


METRICS = _Metrics()


def serve_metrics(port: int, addr: str | None = None) -> int:
    """Serve /metrics on ``addr`` (default ``DPSTREAM_METRICS_ADDR`` or 127.0.0.1) : ``port``
    (0 = don't serve). Returns the port."""
    if port:
        start_http_server(port, addr=addr or os.environ.get("DPSTREAM_METRICS_ADDR") or "127.0.0.1")
    return port


def metric_names() -> set[str]:
    """Every series name the dpstream metrics expose (with the _total/_bucket/_sum/_count suffixes)."""
    names: set[str] = set()
    for metric in METRICS.all():
        for family in metric.collect():
            for sample in family.samples:
                names.add(sample.name)
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
            else:
                names.add(family.name)
            if family.type in ("counter", "histogram"):
                names.add(family.name + "_created")  # the creation timestamp prometheus_client exports
    return {n for n in names if n.startswith("dpstream_")}


# -- users retired by charging releases (heavy hitters with tme/tct, band monitors) ------------------
_retired_seen: dict[tuple[str, int], int] = {}
_retired_lock = threading.Lock()


def observe_partition(partition: int, state) -> None:
    """Record the open step and the retired users of a partition's ``PartitionState``.

    Call after assigning a partition and after applying feedback. Only the number of retired users
    per release is read (an operational count, like the number of reports), never which elements.
    The counter grows by the users retired while this process owns the partition; the first
    observation after an assignment sets the baseline, so a restore does not count them again.
    """
    METRICS.open_step.labels(str(partition)).set(state.closed + 1)
    for name, agg in state.aggregators.items():
        charges, k = getattr(agg, "charges", None), getattr(agg, "k", None)
        if charges is None or not getattr(agg, "counted", False):
            continue
        retired = int((charges >= k).sum())
        METRICS.retired_users_now.labels(name, str(partition)).set(retired)
        with _retired_lock:
            before = _retired_seen.get((name, partition))
            _retired_seen[(name, partition)] = retired
        if before is not None and retired > before:
            METRICS.retired_users.labels(name).inc(retired - before)


def forget_partition(partition: int) -> None:
    """Drop a revoked partition's per-partition series (its new owner reports them)."""
    for gauge, labelled in ((METRICS.open_step, lambda lv: lv == (str(partition),)),
                            (METRICS.retired_users_now, lambda lv: lv[1] == str(partition))):
        for labels in [lv for lv in list(gauge._metrics) if labelled(lv)]:
            gauge.remove(*labels)
    with _retired_lock:
        for key in [k for k in _retired_seen if k[1] == partition]:
            del _retired_seen[key]


# -- consumer lag ------------------------------------------------------------------------------------
def consumer_groups(deployment, names: dict[str, str]) -> dict[str, list[str]]:
    """Consumer group -> topics it consumes. The group ids are the jobs' consumer groups."""
    return {
        f"dpstream-{deployment.name}-ingest": [names["reports"], names["feedback"]],
        f"dpstream-{deployment.name}-releaser": [names["step-partials"], names["control"]],
    }


class ConsumerLagMonitor(threading.Thread):
    """Sets ``dpstream_consumer_lag{topic, partition}`` = log end offset − the group's committed
    offset (the whole log while nothing is committed), every ``interval`` seconds. The log end is
    the true one (:class:`pipeline.stream.log_end.LogEnds`): the embedded broker's ListOffsets answer
    is short by the rest of the last record batch.

    Run it in one process per deployment (the releaser), or every process exports the same series.
    The jobs commit their handled positions every 2 s, so the lag reads up to 2 s' worth high under load.
    """

    def __init__(self, bootstrap: str, groups: dict[str, list[str]], interval: float = 5.0):
        super().__init__(name="dpstream-consumer-lag", daemon=True)
        self.bootstrap = bootstrap
        self.groups = groups
        self.interval = interval
        self._stop = threading.Event()
        self._admin = self._consumer = self._ends = None

    def _clients(self):
        if self._admin is None:
            from kafka import KafkaAdminClient, KafkaConsumer

            from pipeline.stream.log_end import LogEnds

            self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="dpstream-lag")
            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                           client_id="dpstream-lag")
            self._ends = LogEnds(self.bootstrap, client_id="dpstream-lag-ends")
        return self._admin, self._consumer

    def poll_once(self) -> dict[tuple[str, int], int]:
        from kafka import TopicPartition

        admin, consumer = self._clients()
        lags: dict[tuple[str, int], int] = {}
        for group, topics in self.groups.items():
            committed = _committed_offsets(admin, group)
            tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
            for tp, end in self._ends(tps).items():
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
    monitor = ConsumerLagMonitor(runtime.broker, consumer_groups(runtime.deployment, runtime.names), interval)
    monitor.start()
    return monitor

