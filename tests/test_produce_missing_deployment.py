"""`dpstream produce` naming a deployment the broker does not have says it as the analysts'
commands do: `no deployment "X" on broker H:P (topic dpstream.X.deployment does not exist)`,
exit 2 (a configuration error), with nothing sent and no topic made; a deployment that has
topics but not its reports topic is named with what it lacks, exit 2 too. From a file (CSV,
JSONL, Parquet) or simulated, with and without `--dry-run` (real embedded broker and Redis,
`produce` run as the operator runs it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from pipeline.cli.common import EXIT_CONFIG
from pipeline.stream.local.embedded import EmbeddedServices
from support.topic_list import listed_topics

USERS = 50


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    with EmbeddedServices(broker_log=tmp_path_factory.mktemp("broker") / "broker.log") as svc:
        yield svc


def _config(tmp_path, name: str, services) -> str:
    """A valid configuration of deployment ``name`` on the test's broker and Redis."""
    cfg = {
        "name": name,
        "broker": services.broker.bootstrap,
        "redis": services.redis.url,
        "roster": {"source": "range", "size": USERS},
        "horizon": 3,
        "topics": {"partitions": 2},
        "attributes": {"poverty": {"type": "binary", "label": "poor"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 1},
        "releases": [
            {"name": "monthly", "type": "cumulative", "attribute": "poverty", "share": 1.0}
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _source(tmp_path, kind: str) -> list[str]:
    """The arguments of one way of giving the reports: a file of step 1 of every user, or
    ``--simulate``."""
    users = [f"u{i}" for i in range(USERS)]
    if kind == "simulate":
        return ["--simulate"]
    path = tmp_path / f"step1.{kind}"
    if kind == "csv":
        path.write_text(
            "user,step,poverty\n" + "".join(f"{u},1,{i % 2}\n" for i, u in enumerate(users))
        )
    elif kind == "jsonl":
        path.write_text(
            "".join(
                json.dumps({"user": u, "step": 1, "values": {"poverty": i % 2}}) + "\n"
                for i, u in enumerate(users)
            )
        )
    else:
        pq.write_table(
            pa.table(
                {"user": users, "step": [1] * USERS, "poverty": [i % 2 for i in range(USERS)]}
            ),
            path,
        )
    return [f"--{kind}", str(path)]


def _produce(config: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--config", config, *args, "--wait", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("dry_run", [False, True], ids=["send", "dry-run"])
@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet", "simulate"])
def test_produce_to_a_deployment_the_broker_does_not_have_says_so_and_exits_2(
    services, tmp_path, kind, dry_run
):
    """Before: `topic 'dpstream.X.reports' does not exist on H:P: is the deployment 'X' up
    ...? nothing sent`, exit 1 (a runtime failure), where every other command said the line
    below with exit 2."""
    name = f"no-such-{kind}-{'dry' if dry_run else 'send'}"
    broker = services.broker.bootstrap
    before = listed_topics(broker)
    run = _produce(
        _config(tmp_path, name, services),
        *_source(tmp_path, kind),
        *(["--dry-run"] if dry_run else []),
    )
    assert run.returncode == EXIT_CONFIG, (run.stdout, run.stderr)
    assert run.stderr == (
        f'dpstream: no deployment "{name}" on broker {broker} '
        f"(topic dpstream.{name}.deployment does not exist)\n"
    )
    assert "sent" not in run.stdout, run.stdout
    assert listed_topics(broker) == before  # nothing made, so nothing sent


@pytest.mark.parametrize("kind", ["csv", "simulate"])
def test_produce_to_a_deployment_lacking_its_reports_topic_names_what_it_lacks(
    services, tmp_path, kind
):
    """A deployment whose topics were not all created (its descriptor's topic only): the
    reports topic is named as missing, exit 2, nothing made. A file's upload checks the topic
    in its early producer, a simulated step by listing the broker's topics."""
    name = f"half-made-{kind}"
    broker = services.broker.bootstrap
    admin = KafkaAdminClient(bootstrap_servers=broker)
    try:
        admin.create_topics([NewTopic(f"dpstream.{name}.deployment", 1, 1)])
    finally:
        admin.close()
    before = listed_topics(broker)
    run = _produce(_config(tmp_path, name, services), *_source(tmp_path, kind))
    assert run.returncode == EXIT_CONFIG, (run.stdout, run.stderr)
    assert run.stderr.startswith(
        f'dpstream: deployment "{name}" on broker {broker} lacks dpstream.{name}.reports ('
    ), run.stderr
    assert len(run.stderr.splitlines()) == 1
    assert listed_topics(broker) == before
