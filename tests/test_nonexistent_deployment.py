"""A command that only reads, naming a deployment the broker does not have: one line, exit code 2,
and nothing left behind on the broker (real embedded broker; `status` and `close` with a real
embedded Redis holding no state of it).

The embedded broker creates any topic a request names (a Metadata request for it, a ListOffsets
or a Fetch), with its default partition count: a misspelt name left four empty topics, and a later
`dpstream up` of that name was refused because their partition count was not the configuration's.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from pipeline.cli import main
from pipeline.consumer import read_to_end
from pipeline.stream.kafka.topics import ensure_topics
from pipeline.stream.local.embedded import EmbeddedBroker, EmbeddedRedis
from support.topic_list import listed_topics

ANALYST_COMMANDS = {
    "query": ["--release", "monthly", "--step", "1"],
    "export": ["--release", "monthly", "--out", "{tmp}/out.csv"],
    "alerts": [],
    "hash": ["a-value"],
    "report": ["--out", "{tmp}/page"],
}


@pytest.fixture(scope="module")
def broker():
    started = EmbeddedBroker().start()
    yield started.bootstrap
    started.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    started = EmbeddedRedis(tmp_path_factory.mktemp("redis"), generate_password=False).start()
    yield started.url
    started.stop()


def _run(*args) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def _config(tmp_path, name: str, broker: str):
    """A valid configuration of deployment ``name`` on ``broker`` (never started)."""
    cfg = {
        "name": name, "broker": broker, "roster": {"source": "range", "size": 50}, "horizon": 3,
        "topics": {"partitions": 1},
        "attributes": {"poverty": {"type": "binary", "label": "poor"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 1},
        "releases": [{"name": "monthly", "type": "cumulative", "attribute": "poverty",
                      "share": 1.0}],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("command", sorted(ANALYST_COMMANDS))
def test_an_analyst_command_of_a_missing_deployment_says_so_and_creates_nothing(
    broker, tmp_path, command
):
    name = f"no-such-{command}"
    before = listed_topics(broker)
    extra = [a.format(tmp=tmp_path) for a in ANALYST_COMMANDS[command]]
    code, err = _run(command, "--broker", broker, "--deployment", name, *extra)
    assert code == 2, err
    assert err == (
        f'dpstream: no deployment "{name}" on broker {broker} '
        f"(topic dpstream.{name}.deployment does not exist)\n"
    )
    assert listed_topics(broker) == before
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "page").exists()


def test_a_configuration_of_a_deployment_never_started_is_said_and_a_later_up_is_not_refused(
    broker, tmp_path
):
    name = "later"
    config = _config(tmp_path, name, broker)
    for command in ("query", "alerts", "dead-letters"):
        extra = ANALYST_COMMANDS.get(command, [])
        code, err = _run(command, "--config", config, *extra)
        assert (code, err) == (2, f'dpstream: no deployment "{name}" on broker {broker} '
                                  f"(topic dpstream.{name}.deployment does not exist)\n"), err
    assert not {t for t in listed_topics(broker) if f".{name}." in t}
    # the topics a started deployment needs can still be made with its partition counts
    from pipeline.config import load_config

    ensure_topics(broker, load_config(str(config)))
    assert {f"dpstream.{name}.deployment", f"dpstream.{name}.reports"} <= listed_topics(broker)


def test_a_deployment_lacking_some_public_topics_is_named_with_what_it_lacks(broker):
    name = "half-made"
    admin = KafkaAdminClient(bootstrap_servers=broker)
    admin.create_topics([NewTopic(f"dpstream.{name}.deployment", 1, 1)])
    admin.close()
    before = listed_topics(broker)
    code, err = _run("alerts", "--broker", broker, "--deployment", name)
    lacks = ", ".join(f"dpstream.{name}.{t}" for t in ("releases", "synthetic", "alerts"))
    assert code == 2 and err.startswith(
        f'dpstream: deployment "{name}" on broker {broker} lacks {lacks} ('), err
    assert len(err.splitlines()) == 1
    assert listed_topics(broker) == before


def test_read_to_end_reads_the_real_partitions_and_refuses_a_missing_topic(broker):
    from pipeline.stream.kafka.topic_presence import TopicsMissing

    admin = KafkaAdminClient(bootstrap_servers=broker)
    admin.create_topics([NewTopic("three-parts", 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=broker)
    for p in range(3):
        producer.send("three-parts", value=str(p).encode(), partition=p)
    producer.flush()
    producer.close()
    seen: list[tuple[int, bytes]] = []
    read_to_end(broker, ["three-parts"], lambda m: seen.append((m.partition, m.value)))
    assert sorted(seen) == [(0, b"0"), (1, b"1"), (2, b"2")]

    before = listed_topics(broker)
    with pytest.raises(TopicsMissing) as missing:
        read_to_end(broker, ["three-parts", "absent-a", "absent-b"], seen.append, timeout=5)
    assert missing.value.topics == ["absent-a", "absent-b"]
    assert str(missing.value) == f"topics absent-a, absent-b do not exist on broker {broker}"
    assert listed_topics(broker) == before and len(seen) == 3


def test_status_and_close_of_a_deployment_never_started_create_no_topic(
    broker, redis_url, tmp_path, monkeypatch
):
    name = "not-up"
    config = _config(tmp_path, name, broker)
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "home"))  # no `up` record to read
    monkeypatch.setenv("DPSTREAM_REDIS", redis_url)
    line = (f'no deployment "{name}" on broker {broker} '
            f"(topic dpstream.{name}.deployment does not exist)")
    code, err = _run("close", "--config", config, "--step", 1)
    assert (code, err) == (2, f"dpstream: {line}\n"), err
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["status", "--config", str(config), "--json", "--wait", "0"]) == 0
    # the rest of the status is shown; the intake says why it is not
    assert json.loads(out.getvalue())["intake"] == {"unavailable": f"TopicsMissing: {line}"}
    assert not {t for t in listed_topics(broker) if f".{name}." in t}
