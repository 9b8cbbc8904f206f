"""Prometheus metrics of the stream processes. Curator-side: never expose publicly.

Each process serves ``/metrics`` on its own port (``DPSTREAM_METRICS_PORT``), bound to
``DPSTREAM_METRICS_ADDR`` (default 127.0.0.1 everywhere; a deployment that lets Prometheus scrape
over the network opts in explicitly, see deploy/README.md).

Metrics policy (docs/privacy.md, "Metrics and other curator-side outputs"): every series is either

* ``PUBLIC_SERIES``: equal to a value the public topics already show (released step, privacy spent,
  heavy hitters flagged, clamped bins, refusals, republications, the open step); or
* ``OPERATIONAL_SERIES``: curator-side facts about the traffic and the processes (reports by
  status, dead letters by reason, latencies, consumer lag). These are true data about who sent
  what and when, so the endpoints stay private, but none equals a statistic that a release
  protects with noise: no label names an attribute value, element or bin (``ALLOWED_LABELS``),
  and no value counts users by value. (Users retired by charging were exported once; at a band
  monitor's Above/Below they jumped by exactly the count the alert protects, so they are gone.)

The Grafana dashboard shows public series only.
"""

from __future__ import annotations

import os
import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = [
    "METRICS",
    "ALLOWED_LABELS",
    "PUBLIC_SERIES",
    "OPERATIONAL_SERIES",
    "serve_metrics",
    "metric_names",
    "unexport_releaser_series",
    "observe_partition",
    "forget_partition",
]

# Labels a dpstream metric may carry. Every one is public configuration or operational (a status,
# a rejection reason, a partition/topic number, a release name); none can carry data values.
ALLOWED_LABELS = frozenset({"status", "reason", "partition", "release", "topic"})


class _Metrics:
    def __init__(self) -> None:
        self.reports = Counter(
            "dpstream_reports_total", "Reports handled by ingest workers", ["status"]
        )
        self.dead_letters = Counter(
            "dpstream_dead_letters_total", "Reports sent to the dead-letter topic", ["reason"]
        )
        self.open_step = Gauge(
            "dpstream_open_step", "The next step to close, per reports partition", ["partition"]
        )
        self.step_close_seconds = Histogram(
            "dpstream_step_close_seconds",
            "Worker time to close a step (impute, aggregate, checkpoint)",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.release_seconds = Histogram(
            "dpstream_release_seconds",
            "Releaser time from last partial received to manifest published",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.released_step = Gauge("dpstream_released_step", "Last released step")
        self.privacy_rho = Gauge("dpstream_privacy_spent_rho", "zCDP budget spent", ["release"])
        self.privacy_epsilon = Gauge(
            "dpstream_privacy_spent_epsilon", "(eps, delta) budget spent", ["release"]
        )
        self.heavy_hitters = Gauge(
            "dpstream_heavy_hitters", "Elements flagged heavy at the last step", ["release"]
        )
        self.close_to_publish_seconds = Gauge(
            "dpstream_close_to_publish_seconds",
            "Seconds from the last released step's public close time to every record of it acknowledged",
        )
        self.close_to_publish_step = Gauge(
            "dpstream_close_to_publish_step", "The step dpstream_close_to_publish_seconds is about"
        )
        self.publish_overruns = Counter(
            "dpstream_publish_overruns_total",
            "Steps whose release was ready only after close + steps.publish_delay_seconds (published late)",
        )
        self.padding_clamps = Counter(
            "dpstream_padding_clamped_bins_total",
            "Projected counts clamped because the padding was too small",
            ["release"],
        )
        self.budget_refusals = Counter(
            "dpstream_budget_refusals_total", "Releases refused: budget exhausted", ["release"]
        )
        self.republished = Counter(
            "dpstream_republished_steps_total", "Steps republished from their stored record"
        )
        self.consumer_lag = Gauge(
            "dpstream_consumer_lag", "Messages behind the log end", ["topic", "partition"]
        )

    def all(self):
        return [m for m in vars(self).values() if isinstance(m, (Counter, Gauge, Histogram))]


METRICS = _Metrics()

# The two classes of the metrics policy (module docstring), by metric family name.
PUBLIC_SERIES = frozenset(
    {
        "dpstream_released_step",
        "dpstream_open_step",
        "dpstream_privacy_spent_rho",
        "dpstream_privacy_spent_epsilon",
        "dpstream_heavy_hitters",
        "dpstream_padding_clamped_bins",
        "dpstream_budget_refusals",
        "dpstream_republished_steps",
        "dpstream_close_to_publish_step",
    }
)
OPERATIONAL_SERIES = frozenset(
    {
        "dpstream_reports",
        "dpstream_dead_letters",
        "dpstream_step_close_seconds",
        "dpstream_release_seconds",
        "dpstream_close_to_publish_seconds",
        "dpstream_consumer_lag",
        "dpstream_publish_overruns",
    }
)


def unexport_releaser_series() -> None:
    """In a worker: stop exporting the unlabelled series only the releaser sets. Exported, they read 0
    there (``dpstream_released_step 0`` from a worker while the releaser has released step 5)."""
    from prometheus_client import REGISTRY

    for metric in (
        METRICS.released_step,
        METRICS.release_seconds,
        METRICS.close_to_publish_seconds,
        METRICS.close_to_publish_step,
    ):
        try:
            REGISTRY.unregister(metric)
        except KeyError:  # already not exported
            pass


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
                names.add(
                    family.name + "_created"
                )  # the creation timestamp prometheus_client exports
    return {n for n in names if n.startswith("dpstream_")}


# -- per-partition series ----------------------------------------------------------------------------
# Partitions with an open_step series in this process: Gauge.remove of an absent label set raises
# in older prometheus_client releases, and the gauge's own table of children is private.
_OBSERVED: set[str] = set()
_OBSERVED_LOCK = threading.Lock()


def observe_partition(partition: int, state) -> None:
    """Record the open step of a partition's ``PartitionState`` (public: steps close on public
    events). Nothing about its users is read: how many a charging release retired is, at a band
    monitor's Above/Below, exactly the count the alert protects with noise."""
    with _OBSERVED_LOCK:
        METRICS.open_step.labels(str(partition)).set(state.closed + 1)
        _OBSERVED.add(str(partition))


def forget_partition(partition: int) -> None:
    """Drop a revoked partition's per-partition series (its new owner reports them)."""
    with _OBSERVED_LOCK:
        if str(partition) in _OBSERVED:
            METRICS.open_step.remove(str(partition))
            _OBSERVED.discard(str(partition))
