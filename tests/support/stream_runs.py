"""Helpers of the tests that run a deployment through the real stream (embedded broker and Redis,
worker and releaser processes): the two-release panel deployment, its batch reference (the library
run with the stream's derived seeds), the checks that outputs, ledger and manifests equal it, and
waits on the processes' metrics, logs and topics."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from jobs.eval.testbed import binary_panel, write_panel_deployment
from pipeline.config import load_config
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.releaser.engine import batch_reference as engine_reference

N, T, K = 1200, 6, 3


def write_config(tmp_path, services, name: str, n: int = N, horizon: int = T, partitions: int = 2,
                 **extra) -> str:
    return write_panel_deployment(tmp_path, services, name, n=n, horizon=horizon,
                                  partitions=partitions, seed=17, window=K, **extra)


def panel_data(seed: int, n: int = N, horizon: int = T) -> np.ndarray:
    return binary_panel(seed, n, horizon)


def scenario(tmp_path, services, name: str, seed: int, horizon: int = T):
    """(config path, deployment, panel X, roster) of one fault scenario."""
    path = write_config(tmp_path, services, name, horizon=horizon)
    dep = load_config(path)
    return path, dep, panel_data(seed=seed, horizon=horizon), Roster.from_config(dep.roster)


def run_steps(drv, X, steps, cluster: LocalCluster | None = None, **close) -> None:
    """Send every user's report of each step, close it and wait for its release."""
    for t in steps:
        drv.producer.send_step(t, {"pov": X[:, t - 1]})
        drv.close(t, **close)
        if cluster is not None:
            cluster.check_alive()


def batch_reference(dep, X) -> dict[str, np.ndarray]:
    """The library run in batch with the stream's derived seeds (= an uninterrupted run)."""
    return engine_reference(dep, {"pov": X})


def expected_ledger(horizon: int = T) -> list[str]:
    return sorted([f"fw:{t}" for t in range(K, horizon + 1)]
                  + [f"cu:{t}" for t in range(1, horizon + 1)])


def check_outputs(dep, X, panels, store, manifests_seen=None, through: int | None = None) -> None:
    """Outputs equal the batch run, every step complete, one ledger entry per (release, step)."""
    horizon = X.shape[1] if through is None else through
    ref = batch_reference(dep, X[:, :horizon])
    for rel in ("fw", "cu"):
        panel = panels.panels[rel]
        assert panel.complete_steps == set(range(1, horizon + 1)), (rel,
                                                                    sorted(panel.complete_steps))
        np.testing.assert_array_equal(panel.as_array()[:, :horizon], ref[rel], err_msg=rel)
    ledger = store.ledger()
    assert sorted(ledger) == expected_ledger(horizon)
    if horizon == dep.horizon:
        assert sum(e["cost"]["rho"] for e in ledger.values()) == pytest.approx(0.5, rel=1e-12)
    assert store.last_released() == horizon
    if manifests_seen is not None:  # a deduplicating consumer sees each (release, step) once
        expected = sorted((r, t) for r in ("fw", "cu") for t in range(1, horizon + 1))
        assert sorted(manifests_seen) == expected


def metric(cluster: LocalCluster, name: str, sample: str) -> float:
    """A sample of a process's Prometheus endpoint (0 when absent)."""
    port = cluster.metrics_ports[name]
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def wait_accepted(cluster: LocalCluster, name: str, count: int, timeout: float = 60.0) -> None:
    """Wait until worker ``name`` (this incarnation) has accepted at least ``count`` reports."""
    deadline = time.monotonic() + timeout
    while metric(cluster, name, 'dpstream_reports_total{status="accepted"}') < count:
        cluster.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not accept {count} reports within {timeout:.0f} s")
        time.sleep(0.2)


def log_text(tmp_path, name: str) -> str:
    return (Path(tmp_path) / "logs" / f"{name}.log").read_text(errors="replace")


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``predicate`` until it holds; ``TimeoutError(what)`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def read_dead_letters(bootstrap: str, topic: str, expect: int, timeout: float = 30.0):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    out, deadline = [], time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        for msgs in c.poll(timeout_ms=200).values():
            out += [(dict(m.headers), m.value) for m in msgs]
    c.close()
    return out
