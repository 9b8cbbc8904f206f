"""The public topics as documented data (docs/topics.md): every record the releaser writes to
``releases``, ``synthetic`` and ``alerts`` in a real stream (embedded broker and Redis, worker and
releaser processes, all four release types) validates against the packaged JSON Schema of its topic;
the schemas reject malformed records; the analyst example (docs/examples/synthetic_to_pandas.py)
reads the synthetic topic into pandas, drops republished duplicates by key and gets exactly what the
library computes in batch."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

jsonschema = pytest.importorskip("jsonschema")

from pipeline.config import load_config  # noqa: E402
from pipeline.error_bounds import spend_as_approx_dp  # noqa: E402
from pipeline.privacy.ledger import LedgerEntry  # noqa: E402
from pipeline.schemas import PARTS, SCHEMA_TOPICS, load_schema  # noqa: E402
from pipeline.stream.local.cluster import LocalCluster  # noqa: E402
from pipeline.stream.local.driver import StepDriver  # noqa: E402
from pipeline.stream.local.embedded import EmbeddedServices  # noqa: E402
from pipeline.stream.releaser.engine import batch_reference  # noqa: E402
from pipeline.stream.kafka.log_end import log_ends  # noqa: E402
from pipeline.stream.ingest.roster import Roster  # noqa: E402
from pipeline.stream.state.store import StateStore  # noqa: E402
from jobs.eval.testbed import binary_panel, write_panel_deployment  # noqa: E402
from pipeline.stream.kafka.topics import PUBLIC_TOPICS  # noqa: E402

N, T, K, DOMAIN = 1200, 4, 2, 256
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "synthetic_to_pandas.py"


def validator(topic: str, part: str):
    schema = load_schema(topic, part)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[str, dict]]:
    """Every record of partition 0 of ``topic`` (duplicates included), up to its true log end."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    end = log_ends(bootstrap, [tp])[tp]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=16 << 20)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    out, deadline = [], time.monotonic() + timeout
    while consumer.position(tp) < end and time.monotonic() < deadline:
        for msgs in consumer.poll(timeout_ms=200).values():
            out += [(m.key.decode(), m.value) for m in msgs]
    consumer.close()
    assert len(out) == end, f"read {len(out)} of {end} records of {topic}"
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small stream with a fixed-window, a cumulative, a heavy-hitter and a band release."""
    tmp = tmp_path_factory.mktemp("topics")
    with EmbeddedServices() as services:
        path = write_panel_deployment(
            tmp, services, "topics-schemas", n=N, horizon=T, seed=13, window=K,
            attributes={"pov": {"type": "binary"},
                        "item": {"type": "hashed", "size": DOMAIN, "dictionary": {7: "seven"}},
                        "status": {"type": "categorical", "values": ["a", "b"]}},
            budget={"rho": 0.5, "epsilon": 4.0, "delta": 1e-6},
            releases=[
                {"name": "fw", "type": "fixed_window", "attribute": "pov", "window": K, "share": 0.5},
                {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5},
                {"name": "hh", "type": "heavy_hitters", "attribute": "item", "method": "tct", "k": 2, "share": 0.5},
                {"name": "band", "type": "band_monitor", "attribute": "status", "value": "b", "low": 300,
                 "high": 900, "share": 0.5},
            ])
        dep = load_config(path)
        rng = np.random.default_rng(5)
        pov = binary_panel(3, N, T)
        items = np.where(rng.random((N, T)) < 0.4, 7, rng.integers(0, DOMAIN, size=(N, T)))  # 7 is heavy
        status = rng.integers(0, 2, size=(N, T))
        with LocalCluster(path, dep, workers=1, log_dir=tmp / "logs") as cluster:
            drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
            for t in range(1, T + 1):
                drv.producer.send_step(t, {"pov": pov[:, t - 1], "item": items[:, t - 1], "status": status[:, t - 1]})
                drv.close(t)
            drv.shutdown()
            cluster.check_alive()
            records = {topic: read_all(cluster.broker, cluster.names[topic]) for topic in PUBLIC_TOPICS}
            ledger = StateStore.from_url(services.redis.url, dep.name).ledger()
            yield {"dep": dep, "pov": pov, "records": records, "broker": cluster.broker, "names": cluster.names,
                   "ledger": ledger}


def test_every_public_topic_has_a_key_and_a_value_schema():
    assert set(SCHEMA_TOPICS) == set(PUBLIC_TOPICS)
    for topic in SCHEMA_TOPICS:
        for part in PARTS:
            assert load_schema(topic, part)["$schema"] == "https://json-schema.org/draft/2020-12/schema"
            validator(topic, part)  # the schema itself is valid draft 2020-12


def test_every_record_the_releaser_writes_validates_against_its_topic_schema(run):
    records = run["records"]
    # one manifest per release and step, one alert per monitor and step; chunks for every synthetic step
    assert len(records["releases"]) == 4 * T and len(records["alerts"]) == 2 * T
    types = {orjson.loads(v)["type"] for _, v in records["releases"]}
    assert types == {"fixed_window", "cumulative", "heavy_hitters", "band_monitor"}
    assert {orjson.loads(v)["type"] for _, v in records["alerts"]} == {"heavy_hitters", "band"}
    assert any(orjson.loads(v).get("labels") for _, v in records["alerts"]), "no flagged id had a public label"
    assert any("status" in orjson.loads(v) for _, v in records["releases"]), "no fixed-window step before k"
    for topic in PUBLIC_TOPICS:
        keys, values = validator(topic, "key"), validator(topic, "value")
        assert records[topic], topic
        for key, raw in records[topic]:
            keys.validate(key)
            value = orjson.loads(raw)
            values.validate(value)
            if topic == "deployment":  # the descriptor: its fingerprint is the hash of its privacy document
                from pipeline.stream.state.fingerprint import fingerprint

                assert value["deployment"] == run["dep"].name and value["n"] == N
                assert value["fingerprint"] == fingerprint(value["privacy_config"])
                continue
            assert key.split(":")[:2] == [value["release"], str(value["step"])], (topic, key)


@pytest.mark.parametrize("topic,mutate", [
    ("releases", lambda m: m["synthetic"].pop("sha256")),
    ("releases", lambda m: m["synthetic"].update(dtype="uint8")),
    ("releases", lambda m: m.update(step=0)),
    ("releases", lambda m: m["privacy"].update(step_cost={"rho": -1.0})),
    ("releases", lambda m: m["parameters"].pop("n_pad")),
    ("releases", lambda m: m.update(true_counts=[1, 2])),  # nothing beyond the documented fields
    ("synthetic", lambda c: c["values"].update({"x": [0]})),
    ("synthetic", lambda c: c.update(chunk=-1)),
    ("alerts", lambda a: a.update(answer="sideways") if a["type"] == "band" else a.update(flagged=[3, 3])),
])
def test_a_malformed_record_is_rejected(run, topic, mutate):
    if topic == "releases":
        good = next(orjson.loads(v) for _, v in run["records"]["releases"]
                    if orjson.loads(v)["type"] == "fixed_window" and "synthetic" in orjson.loads(v))
    else:
        good = orjson.loads(run["records"][topic][0][1])
    check = validator(topic, "value")
    check.validate(good)  # the unchanged record passes
    bad = copy.deepcopy(good)
    mutate(bad)
    with pytest.raises(jsonschema.ValidationError):
        check.validate(bad)


@pytest.mark.parametrize("topic,key", [("releases", "fw-3"), ("releases", "fw:0"), ("synthetic", "fw:3"),
                                       ("alerts", "hh:3:0")])
def test_a_malformed_key_is_rejected(topic, key):
    with pytest.raises(jsonschema.ValidationError):
        validator(topic, "key").validate(key)


def test_status_spend_equals_what_the_manifests_report(run):
    """`dpstream status` reports the ledger as one (ε, δ) with the same conversion as the manifests."""
    last = [orjson.loads(v) for _, v in run["records"]["releases"]][-1]
    spent = spend_as_approx_dp(run["dep"], [LedgerEntry.from_state(e).cost for e in run["ledger"].values()])
    reported = last["privacy"]["deployment_spent_as_approx_dp"]
    assert spent.epsilon == pytest.approx(reported["epsilon"], rel=1e-12)
    assert spent.delta == pytest.approx(reported["delta"], rel=1e-12)


def test_pandas_example_reads_the_synthetic_topic_and_drops_republished_duplicates(run, tmp_path):
    """Republish part of the public log (as a releaser restarted mid-publication does: same keys, same
    bytes); the example's DataFrame still equals the batch library run, and it says what it dropped."""
    from kafka import KafkaProducer

    again = [(run["names"][t], k, v) for t in ("releases", "synthetic") for k, v in run["records"][t]
             if k.split(":")[1] in ("2", "3")]
    assert len(again) >= 2 * 2 * 2  # manifests and chunks of two steps of two synthetic releases
    producer = KafkaProducer(bootstrap_servers=run["broker"])
    for topic, key, value in again:
        producer.send(topic, key=key.encode(), value=value, partition=0)
    producer.flush()
    producer.close()

    ref = batch_reference(run["dep"], {"pov": run["pov"]})
    for release in ("fw", "cu"):
        out = tmp_path / f"{release}.csv"
        proc = subprocess.run([sys.executable, str(EXAMPLE), "--bootstrap", run["broker"], "--deployment",
                               run["dep"].name, "--release", release, "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert f"dropped {len(again)} republished duplicate records" in proc.stdout, proc.stdout
        frame = pd.read_csv(out, index_col="record")
        assert list(frame.columns) == [f"step_{t}" for t in range(1, T + 1)]
        np.testing.assert_array_equal(frame.to_numpy(), ref[release])
