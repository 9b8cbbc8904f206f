"""Prometheus metrics of the stream processes (DESIGN §7). Curator-side: never expose publicly.

Each process serves ``/metrics`` on its own port (``DPSTREAM_METRICS_PORT``). Metrics carry
operational counts only (how many reports, which rejection reasons, latencies, privacy spent); no
true statistic of the data is exported.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = ["METRICS", "serve_metrics"]


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
        self.padding_clamps = Counter(
            "dpstream_padding_clamped_bins_total", "Projected counts clamped because the padding was too small",
            ["release"])
        self.budget_refusals = Counter("dpstream_budget_refusals_total", "Releases refused: budget exhausted", ["release"])
        self.republished = Counter("dpstream_republished_steps_total", "Steps republished from their stored record")
        self.consumer_lag = Gauge("dpstream_consumer_lag", "Messages behind the log end", ["topic", "partition"])


METRICS = _Metrics()


def serve_metrics(port: int) -> int:
    """Serve /metrics on 127.0.0.1:``port`` (0 = don't serve). Returns the port."""
    if port:
        start_http_server(port, addr="127.0.0.1")
    return port
