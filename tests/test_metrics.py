"""The stream's metrics as a real Prometheus server scrapes them.

A small deployment (embedded broker and Redis, a releaser and two workers as separate processes)
runs three steps with a few bad reports; then a Prometheus server (the Debian package's
/usr/bin/prometheus, installed by scripts/install-prometheus.sh — this test installs nothing)
scrapes every process each second, and the assertions go through its HTTP query API, so metric
names, labels, exposition format and values are checked end to end.

The helpers that the jobs call (per-partition series, consumer lag) are also checked directly against
a real PartitionState and the real broker.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from prometheus_client import REGISTRY

from pipeline.config import load_config
from pipeline.stream.kafka import consumer_lag
from pipeline.stream.process import metrics as M
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.ingest.roster import Roster
from support.prometheus import Prometheus

REPO = Path(__file__).resolve().parents[1]
N, T, P, WORKERS, WINDOW, DOMAIN, HOT = 600, 3, 2, 2, 2, 64, 7


# -- the deployment ----------------------------------------------------------------------------------
def _data(seed: int = 17):
    rng = np.random.default_rng(seed)
    pov = rng.integers(0, 2, size=(N, T))
    # Most users hold one hot item, so the heavy-hitter release flags it and charges (retires) them.
    items = np.where(rng.random((N, T)) < 0.6, HOT, rng.integers(0, DOMAIN, size=(N, T)))
    present = np.ones((N, T), dtype=bool)
    present[rng.choice(N, size=N // 10, replace=False), 1] = False  # 10% miss step 2 (imputed)
    return pov, items, present


def _true_statistics(pov, items, present) -> set[float]:
    """Counts of users by value that a leaking metric would carry: per step, per window pattern,
    cumulative thresholds, per item (carry-forward imputation, as the workers do)."""
    x_pov, x_item = pov.copy(), items.copy()
    for t in range(1, T):
        x_pov[~present[:, t], t] = x_pov[~present[:, t], t - 1]
        x_item[~present[:, t], t] = x_item[~present[:, t], t - 1]
    stats: set[float] = set()
    for t in range(T):
        stats.update(np.bincount(x_pov[:, t], minlength=2).tolist())
        stats.update(np.bincount(x_item[:, t]).tolist())
        stats.update(np.bincount((x_pov[:, : t + 1]).sum(axis=1)).tolist())
        if t + 1 >= WINDOW:
            codes = x_pov[:, t + 1 - WINDOW] * 2 + x_pov[:, t]
            stats.update(np.bincount(codes, minlength=4).tolist())
    out = {float(s) for s in stats if s > 20}  # small counts collide with step numbers and latencies
    assert len(out) >= 10  # the check below is not vacuous
    return out


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    Prometheus.require()  # before spending time on the deployment
    tmp = tmp_path_factory.mktemp("metrics")
    pov, items, present = _data()
    with EmbeddedServices() as services:
        cfg = {
            "name": "metrics-e2e",
            "broker": services.broker.bootstrap,
            "redis": services.redis.url,
            "roster": {"size": N},
            "horizon": T + 1,
            "topics": {"partitions": P},
            "attributes": {"pov": {"type": "binary"}, "item": {"type": "hashed", "size": DOMAIN}},
            "budget": {"rho": 0.5, "epsilon": 4.0, "delta": 1e-6},
            "random": {"kind": "seeded", "seed": 23},
            "releases": [
                {"name": "fw", "type": "fixed_window", "attribute": "pov", "window": WINDOW, "share": 0.5},
                {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5},
                {"name": "hh", "type": "heavy_hitters", "attribute": "item", "method": "tct", "k": 1, "share": 1.0},
            ],
        }
        path = tmp / "deployment.yaml"
        path.write_text(yaml.safe_dump(cfg))
        dep = load_config(path)
        roster = Roster.from_config(dep.roster)
        owners = roster.owners(P)
        owner0 = next(u for u in roster.ids if owners[roster.row(u)] == 0)
        with LocalCluster(path, dep, workers=WORKERS, log_dir=tmp / "logs", metrics=True) as cluster:
            drv = StepDriver(cluster.broker, dep, roster, cluster.names, cluster=cluster)
            bad = {"malformed": 2, "unknown_user": 1, "out_of_domain": 1, "late": 1}
            drv.producer.send_raw(b'{"user": "u1", "step": 1', partition=0)
            drv.producer.send_raw(b"not json", partition=0)
            drv.producer.send_raw(orjson.dumps({"user": "nobody", "step": 1, "values": {"pov": 1, "item": 3}}),
                                  partition=0)
            drv.producer.send_raw(orjson.dumps({"user": owner0, "step": 1, "values": {"pov": 5, "item": 3}}),
                                  partition=0)
            sent = 0
            for t in range(1, T + 1):
                sent += drv.producer.send_step(t, {"pov": pov[:, t - 1], "item": items[:, t - 1]},
                                               present=present[:, t - 1])
                drv.close(t)
                if t == 1:
                    drv.producer.send_raw(orjson.dumps({"user": owner0, "step": 1, "values": {"pov": 0, "item": 3}}),
                                          partition=0)
            cluster.check_alive()
            # Alerts travel on their own topic: a step's manifests may be read before its alert.
            deadline = time.monotonic() + 30
            while any(("hh", t) not in drv.panels.alerts for t in range(1, T + 1)) and time.monotonic() < deadline:
                drv.poll()
            manifests = {name: drv.panels.panels[name].manifests for name in ("fw", "cu", "hh")}
            alerts = dict(drv.panels.alerts)
            drv.shutdown()

            targets = {"dpstream-releaser": [cluster.metrics_ports["releaser"]],
                       "dpstream-worker": [cluster.metrics_ports[f"worker-{i}"] for i in range(WORKERS)]}
            prom = Prometheus(tmp / "prometheus", targets)
            try:
                # Every target up and scraped after the run settled (the processes are idle now).
                prom.wait("up == 1", lambda r: r is not None and len(r) == 1 + WORKERS)
                prom.wait("max(dpstream_released_step)", lambda r: bool(r) and float(r[0]["value"][1]) == T)
                yield dict(prom=prom, sent=sent, bad=bad, manifests=manifests, alerts=alerts, dep=dep,
                           names=cluster.names, truth=_true_statistics(pov, items, present),
                           items=items, present=present)
            finally:
                prom.stop()


def test_all_processes_scraped(scraped):
    prom = scraped["prom"]
    assert prom.by("up", "job") == {"dpstream-releaser": 1.0, "dpstream-worker": 1.0}
    assert prom.value('count(up{job="dpstream-worker"} == 1)') == WORKERS


def test_reports_and_dead_letters(scraped):
    prom = scraped["prom"]
    assert prom.value('sum(dpstream_reports_total{status="accepted"})') == scraped["sent"]
    assert prom.value('sum(dpstream_reports_total{status="rejected"})') == sum(scraped["bad"].values())
    assert prom.by("sum by (reason) (dpstream_dead_letters_total)", "reason") == scraped["bad"]


def test_steps_latencies_and_privacy(scraped):
    prom, manifests = scraped["prom"], scraped["manifests"]
    # Unlabelled series are exported by every process (0 where unused): aggregate across targets.
    assert prom.value("max(dpstream_released_step)") == T
    assert prom.value('dpstream_released_step{job="dpstream-releaser"}') == T
    # only the releaser knows the released step: a worker exporting it would say 0
    assert prom.by("dpstream_released_step", "job") == {"dpstream-releaser": T}
    # Workers set the open step per partition; a partition moved in a rebalance keeps a stale series
    # on its former owner until it is forgotten, so take the furthest one.
    assert prom.by("max by (partition) (dpstream_open_step)", "partition") == {str(p): T + 1 for p in range(P)}
    # One close per partition and step (at least: a close replayed after a rebalance counts again).
    assert prom.value("sum(dpstream_step_close_seconds_count)") >= P * T
    assert prom.value('sum(dpstream_step_close_seconds_bucket{le="+Inf"})') == \
        prom.value("sum(dpstream_step_close_seconds_count)")
    assert prom.value("sum(dpstream_release_seconds_count)") == T
    assert prom.value("sum(dpstream_release_seconds_sum)") > 0
    for hist in ("dpstream_release_seconds", "dpstream_step_close_seconds"):
        # Over the whole run (cumulative buckets, no rate: there may be a single scrape so far).
        median = prom.value(f"histogram_quantile(0.5, sum by (le) ({hist}_bucket))")
        assert math.isfinite(median) and 0 < median <= 30, (hist, median)
    for name in ("fw", "cu"):
        assert prom.value(f'dpstream_privacy_spent_rho{{release="{name}"}}') == pytest.approx(
            manifests[name][T]["privacy"]["release_spent"]["rho"], rel=1e-12)
    assert prom.value('dpstream_privacy_spent_epsilon{release="hh"}') == pytest.approx(
        manifests["hh"][T]["privacy"]["release_spent"]["epsilon"], rel=1e-12)
    assert prom.value('dpstream_heavy_hitters{release="hh"}') == len(scraped["alerts"][("hh", T)]["flagged"])
    assert any(scraped["alerts"][("hh", t)]["flagged"] for t in range(1, T + 1)), "nothing flagged: vacuous"


def test_no_metric_carries_a_true_statistic(scraped):
    """Trust boundary (docs/privacy.md): labels are operational only, every series is a declared
    dpstream metric, and no value equals a count of users by value (per bin, item, pattern...)."""
    series = scraped["prom"].query('{__name__=~"dpstream_.*"}')
    assert series
    declared = M.metric_names()
    leaks = []
    for s in series:
        labels = set(s["metric"]) - {"__name__", "job", "instance", "le"}
        assert labels <= M.ALLOWED_LABELS, s["metric"]
        assert s["metric"]["__name__"] in declared, s["metric"]
        # Report and dead-letter counts are counts of reports (operational), checked exactly above.
        if s["metric"]["__name__"] in ("dpstream_reports_total", "dpstream_dead_letters_total"):
            continue
        if float(s["value"][1]) in scraped["truth"]:
            leaks.append(s)
    assert not leaks, leaks


def test_close_to_publish_latency_is_curator_side(scraped):
    """The public records carry the close time; the close -> publish latency is only a gauge here."""
    prom = scraped["prom"]
    assert prom.value('dpstream_close_to_publish_step{job="dpstream-releaser"}') == T
    assert 0 < prom.value('dpstream_close_to_publish_seconds{job="dpstream-releaser"}') < 60
    for name, by_step in scraped["manifests"].items():
        assert [by_step[t]["released_at"] for t in range(1, T + 1)] == sorted(
            by_step[t]["released_at"] for t in range(1, T + 1)), name


def test_consumer_lag_scraped(scraped):
    prom, names = scraped["prom"], scraped["names"]
    topics = {names["reports"], names["feedback"], names["repartition"], names["step-partials"], names["control"]}
    # Idle deployment: once the consumers have committed, every consumed partition is caught up.
    result = prom.wait("dpstream_consumer_lag", lambda r: bool(r) and all(float(s["value"][1]) == 0 for s in r))
    assert {(s["metric"]["topic"], s["metric"]["partition"]) for s in result} >= \
        {(names["reports"], str(p)) for p in range(P)}
    assert {s["metric"]["topic"] for s in result} == topics
    assert all(float(s["value"][1]) == 0 for s in result), result


# -- the helpers, without the jobs -----------------------------------------------------------------
def test_lag_monitor_against_the_broker():
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.structs import OffsetAndMetadata

    with EmbeddedServices() as services:
        boot = services.broker.bootstrap
        admin = KafkaAdminClient(bootstrap_servers=boot)
        admin.create_topics([NewTopic("lag-test", 2, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=boot)
        # One record per batch: the embedded (Tansu) broker reports the log end as the last batch's
        # base offset + 1, which is the true end only for single-record batches (Apache Kafka: always).
        for partition, count in ((0, 10), (1, 3)):
            for i in range(count):
                producer.send("lag-test", value=b"%d" % i, partition=partition)
                producer.flush()
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=boot, group_id="lag-group", enable_auto_commit=False)
        consumer.commit({TopicPartition("lag-test", 0): OffsetAndMetadata(4, "", -1)})
        consumer.close()
        monitor = consumer_lag.ConsumerLagMonitor(boot, {"lag-group": ["lag-test"]})
        try:
            lags = monitor.poll_once()
        finally:
            monitor._close_clients()
        assert lags == {("lag-test", 0): 6, ("lag-test", 1): 3}  # partition 1: nothing committed
        assert REGISTRY.get_sample_value("dpstream_consumer_lag", {"topic": "lag-test", "partition": "0"}) == 6


def _all_sample_values() -> list[float]:
    return [sample.value for metric in M.METRICS.all() for family in metric.collect() for sample in family.samples]


def test_no_series_moves_by_the_count_a_band_alert_protects():
    """At a band monitor's Above, the users holding the watched value leave its active set. Their
    number is exactly the count the alert protects with noise, so no metric may carry it (an
    earlier gauge of retired users jumped by it). The same for a heavy-hitter flag with k = 1."""
    from pipeline.config import parse_config
    from pipeline.stream.ingest.partition_state import PartitionState
    from pipeline.stream.ingest.reports import ParsedReports

    dep = parse_config({
        "name": "retired", "roster": {"size": 500}, "horizon": 3, "topics": {"partitions": 1},
        "attributes": {"status": {"type": "categorical", "values": ["a", "b"]},
                       "item": {"type": "hashed", "size": 16}},
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "releases": [{"name": "band-unit", "type": "band_monitor", "attribute": "status", "value": "b",
                      "low": 10, "high": 20, "share": 0.5},
                     {"name": "hh-unit", "type": "heavy_hitters", "attribute": "item", "k": 1, "share": 0.5}],
    })
    rows = np.arange(500)
    holders_b, holders_5 = 437, 391  # distinct from every step, port and count below
    status = (rows < holders_b).astype(np.int64)
    item = np.where(rows < holders_5, 5, 9)
    st = PartitionState(dep, 0, rows, 500)
    M.forget_partition(0)
    M.observe_partition(0, st)
    st.apply(ParsedReports.of_singles(rows, np.full(500, 1), {"status": status, "item": item}))
    st.close(1)
    st.apply_feedback(1, "band-unit", {"flagged": [1]})  # Above: the holders of "b" retire
    st.apply_feedback(1, "hh-unit", {"flagged": [5]})  # k = 1: the holders of item 5 retire
    M.observe_partition(0, st)
    assert REGISTRY.get_sample_value("dpstream_open_step", {"partition": "0"}) == 2
    values = _all_sample_values()
    assert holders_b not in values and holders_5 not in values
    M.forget_partition(0)
    assert REGISTRY.get_sample_value("dpstream_open_step", {"partition": "0"}) is None
    M.forget_partition(0)  # forgetting an unknown partition is a no-op


def test_every_metric_is_public_or_operational():
    """The metrics policy (docs/privacy.md): each family in exactly one class; the public ones equal
    values on the public topics (checked against the manifests in the scrape tests)."""
    families = {family.name for metric in M.METRICS.all() for family in metric.describe()}
    assert families == M.PUBLIC_SERIES | M.OPERATIONAL_SERIES
    assert not M.PUBLIC_SERIES & M.OPERATIONAL_SERIES


def test_metrics_labels_are_operational_only():
    for metric in M.METRICS.all():
        assert set(metric._labelnames) <= M.ALLOWED_LABELS, metric._name


def test_dashboard_queries_run_on_the_scraped_series(scraped):
    """Every PromQL expression of the Grafana dashboard runs on the real server; those over series
    this run must produce (all but budget refusals and clamps) return data."""
    prom = scraped["prom"]
    dash = json.loads((REPO / "deploy" / "grafana" / "dpstream-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    may_be_empty = {"dpstream_budget_refusals_total", "dpstream_padding_clamped_bins_total"}
    # rate() needs two scrapes in its window
    prom.wait("sum(rate(dpstream_reports_total[1m]))", lambda r: bool(r))
    empty = [e for e in exprs if not prom.query(e) and not any(m in e for m in may_be_empty)]
    assert not empty, empty
