"""Scale out: 1, 2 and 4 ingest workers over 8 partitions release exactly the same thing.

Partial aggregates are sums over each partition's users, so the releaser's input — and with the
same seeds its output — cannot depend on how partitions are spread over workers (docs/streaming.md,
"Scaling out"). The same seeded deployment (under three names: own topics and Redis keys) is run
with 1, 2 and 4 worker processes; the consumed synthetic panels and the manifests (noisy/projected counts, parameters,
privacy, checksums) must be identical across runs and equal to the library run in batch.

What breaks this test: a partition whose users are counted by two workers or by none after a
rebalance (counts change), partials summed in an order-dependent way, a partition that is never
assigned (the step is never released: timeout), or state that leaks between partitions.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore
from support.stream_runs import batch_reference, expected_ledger, log_text, panel_data, write_config

N, T, PARTITIONS = 800, 4, 8


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def run(services, tmp_path, workers: int, X):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_config(tmp_path, services, f"scale-{workers}w", n=N, horizon=T, partitions=PARTITIONS)
    dep = load_config(path)
    roster = Roster.from_config(dep.roster)
    with LocalCluster(path, dep, workers=workers, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        for t in range(1, T + 1):
            drv.producer.send_step(t, {"pov": X[:, t - 1]})
            drv.close(t, timeout=120)
        drv.shutdown()
        cluster.check_alive()
        closers = {}  # which worker closed the last step of each partition
        for i in range(workers):
            for part, step in re.findall(r"partition (\d+) closed step (\d+)", log_text(tmp_path, f"worker-{i}")):
                if int(step) == T:
                    closers[int(part)] = i
    ledger = {k: e["cost"] for k, e in StateStore.from_url(services.redis.url, dep.name).ledger().items()}
    manifests = {rel: {t: {k: v for k, v in m.items() if k not in ("released_at", "deployment", "instance")}
                       for t, m in drv.panels.panels[rel].manifests.items()} for rel in ("fw", "cu")}
    panels = {rel: drv.panels.panels[rel].as_array() for rel in ("fw", "cu")}
    return dep, panels, manifests, ledger, closers


def test_two_and_four_workers_release_what_one_worker_releases(services, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the jobs' working directory
    X = panel_data(seed=31, n=N, horizon=T)
    results = {w: run(services, tmp_path / f"w{w}", w, X) for w in (1, 2, 4)}
    dep, panels1, manifests1, ledger1, _ = results[1]
    ref = batch_reference(dep, X)
    for rel in ("fw", "cu"):
        np.testing.assert_array_equal(panels1[rel], ref[rel])
    assert sorted(ledger1) == expected_ledger(T)
    for w in (2, 4):
        _, panels, manifests, ledger, closers = results[w]
        assert sorted(closers) == list(range(PARTITIONS))
        assert len(set(closers.values())) == w, f"the {w} workers did not share the partitions: {closers}"
        for rel in ("fw", "cu"):
            np.testing.assert_array_equal(panels[rel], panels1[rel], err_msg=f"{w} workers, {rel}")
            assert manifests[rel] == manifests1[rel], f"{w} workers, {rel}: manifests differ"
        assert manifests["fw"][T]["noisy_counts"] == manifests1["fw"][T]["noisy_counts"]
        assert ledger == ledger1
