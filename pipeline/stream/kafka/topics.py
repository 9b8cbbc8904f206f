"""The deployment's topics, declared once: name, partitions, key and value format, whether the topic
is public, which consumer group reads it, and which role reads, writes or only asks for the offsets of
it (kafka-python admin client for creation).

Every user of a topic takes it from here: the jobs (what they subscribe to, their group ids),
:func:`ensure_topics` and ``deploy/create_topics.py`` (partitions, retention), the lag metric
(:func:`consumer_groups`, :func:`offsets_only`), the broker ACLs (:mod:`pipeline.acl`, which grants a
role exactly the operations declared here), the demo driver and the downstream consumer (the public
topics). The message formats themselves are described in :mod:`pipeline.stream.kafka.messages`.

Roles (docs/security.md): ``worker`` and ``releaser`` are the stream jobs; ``operator`` is ``dpstream
produce|close|status|dead-letters`` (the intake view reads the true ends of ``reports`` and
``repartition``, which on the embedded broker takes a Fetch: :mod:`pipeline.stream.kafka.log_end`;
``dead-letters`` reads ``dead-letter``); ``producer`` is a data-collection service; ``analyst`` is
``dpstream export|query`` and any downstream consumer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.connections import kafka_security

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = [
    "PartitionCountChanged",
    "Topic",
    "TOPICS",
    "PUBLIC_TOPICS",
    "INGEST",
    "RELEASER",
    "KAFKA_ROLES",
    "GROUP_ROLES",
    "LAG_ROLE",
    "topic_names",
    "topic_partitions",
    "group_id",
    "downstream_group_prefix",
    "read_by",
    "consumer_groups",
    "offsets_only",
    "new_topics",
    "ensure_topics",
]

# Consumer groups (roles): the ingest workers and the single releaser. Public topics are read by
# downstream consumers with their own groups (or none).
INGEST, RELEASER = "ingest", "releaser"
KAFKA_ROLES = ("worker", "releaser", "operator", "producer", "analyst")
GROUP_ROLES = {
    INGEST: "worker",
    RELEASER: "releaser",
}  # consumer group -> the role whose job is in it
LAG_ROLE = "releaser"  # runs the consumer-lag gauge (describes every group: pipeline.stream.process.metrics)

# The public topics are the product and the fence's evidence (pipeline.stream.releaser.fence): Kafka's default
# retention (7 days) would delete old manifests, and with them what a wiped state is checked against.
KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


class PartitionCountChanged(RuntimeError):
    """The deployment's topics exist with another partition count than ``topics.partitions`` says: a
    configuration refusal (exit code 2), not a runtime failure."""


@dataclass(frozen=True)
class Topic:
    name: str  # logical name; the broker's is ``<prefix>.<deployment>.<name>``
    partitions: int | None  # None: the deployment's ``topics.partitions``
    key: str  # what the key is (see pipeline.stream.kafka.messages)
    value: str  # the value's codec: "json", or "binary" (a state blob, packed rows, a dead letter's bytes)
    public: bool  # part of the product (kept forever, read by analysts); else curator-side
    reader: str | None  # the dpstream consumer group (role) that reads it; None: downstream only
    writers: tuple[str, ...] = ()  # roles that produce to it (Kafka Write)
    readers: tuple[str, ...] = ()  # roles that fetch it (Kafka Read): every byte of it reaches them
    offsets: tuple[
        str, ...
    ] = ()  # roles that only list its offsets (Kafka Describe: lag, never its records)

    def config(self) -> dict[str, str]:
        """Topic configuration at creation."""
        return KEEP_FOREVER if self.public else {}

    def access(self, role: str) -> set[str]:
        """What ``role`` does with this topic: a subset of {"read", "write", "offsets"}."""
        return (
            ({"read"} if role in self.readers else set())
            | ({"write"} if role in self.writers else set())
            | ({"offsets"} if role in self.offsets else set())
        )


_ANALYSTS = ("analyst",)
TOPICS: dict[str, Topic] = {
    t.name: t
    for t in (
        # close markers are written by the releaser; the operator's intake view reads the log ends
        Topic(
            "reports",
            None,
            "user id; none for close markers",
            "json",
            public=False,
            reader=INGEST,
            writers=("producer", "operator", "releaser"),
            readers=("worker", "operator"),
            offsets=("releaser",),
        ),
        Topic(
            "feedback",
            None,
            "<release>:<step>",
            "json",
            public=False,
            reader=INGEST,  # co-partitioned with reports
            writers=("releaser",),
            readers=("worker",),
            offsets=("releaser",),
        ),
        # reports routed to their user's owner partition (pipeline.stream.ingest.repartition), co-partitioned too
        Topic(
            "repartition",
            None,
            "none (source partition and positions in headers)",
            "binary",
            public=False,
            reader=INGEST,
            writers=("worker",),
            readers=("worker", "operator"),
            offsets=("releaser",),
        ),
        Topic(
            "control",
            1,
            "none",
            "json",
            public=False,
            reader=RELEASER,
            writers=("operator",),
            readers=("releaser",),
        ),
        Topic(
            "step-partials",
            1,
            "<step>:<partition>:<chunk>",
            "binary",
            public=False,
            reader=RELEASER,  # in order
            writers=("worker",),
            readers=("releaser",),
        ),
        # the releaser reads its own manifests back: the fence (pipeline.stream.releaser.fence)
        Topic(
            "releases",
            1,
            "<release>:<step>",
            "json",
            public=True,
            reader=None,
            writers=("releaser",),
            readers=("releaser", *_ANALYSTS),
        ),
        Topic(
            "synthetic",
            1,
            "<release>:<step>:<chunk>",
            "json",
            public=True,
            reader=None,
            writers=("releaser",),
            readers=_ANALYSTS,
        ),
        Topic(
            "alerts",
            1,
            "<release>:<step>",
            "json",
            public=True,
            reader=None,
            writers=("releaser",),
            readers=_ANALYSTS,
        ),
        # the public deployment descriptor (pipeline.descriptor): n, labels and parameters for the analysts;
        # the public keys of closes for the operator's `produce --dry-run` (only the releaser writes it)
        Topic(
            "deployment",
            1,
            "descriptor",
            "json",
            public=True,
            reader=None,
            writers=("releaser",),
            readers=(*_ANALYSTS, "operator"),
        ),
        # rejected reports with their reasons, written by the workers (reports, unverified markers) and
        # the releaser (unverified control commands); read by `dpstream dead-letters` and `produce`'s
        # verdict on its own reports (pipeline.fates): the operator reads raw reports anyway
        Topic(
            "dead-letter",
            1,
            "the original key",
            "binary",
            public=False,
            reader=None,
            writers=("worker", "releaser"),
            readers=("operator",),
        ),
    )
}
PUBLIC_TOPICS = tuple(name for name, t in TOPICS.items() if t.public)


def topic_names(deployment) -> dict[str, str]:  # a Deployment, or its name and topics.prefix
    """Logical topic -> broker topic name (``<prefix>.<deployment>.<topic>``)."""
    prefix = deployment.topics.prefix
    return {t: f"{prefix}.{deployment.name}.{t}" for t in TOPICS}


def topic_partitions(deployment: Deployment) -> dict[str, int]:
    return {
        name: deployment.topics.partitions if t.partitions is None else t.partitions
        for name, t in TOPICS.items()
    }


def group_id(deployment: Deployment, role: str) -> str:
    """The consumer group of a dpstream role (``INGEST`` or ``RELEASER``) in this deployment."""
    if role not in (INGEST, RELEASER):
        raise ValueError(f"role must be {INGEST!r} or {RELEASER!r}, got {role!r}")
    return f"dpstream-{deployment.name}-{role}"


def downstream_group_prefix(deployment: Deployment) -> str:
    """Consumer groups of downstream consumers of the public topics start with this (the analysts' grant)."""
    return f"dpstream-{deployment.name}-downstream"


def offsets_only(role: str) -> list[str]:
    """The logical topics whose offsets ``role`` may list but whose records it may not fetch."""
    return [name for name, t in TOPICS.items() if role in t.offsets and role not in t.readers]


def read_by(role: str) -> list[str]:
    """The logical topics the group of ``role`` reads."""
    return [name for name, t in TOPICS.items() if t.reader == role]


def consumer_groups(
    deployment: Deployment, names: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """Consumer group id -> the broker topics it consumes (the jobs' groups)."""
    names = names or topic_names(deployment)
    return {
        group_id(deployment, role): [names[t] for t in read_by(role)] for role in (INGEST, RELEASER)
    }


def new_topics(deployment: Deployment, existing, replication: int = 1) -> list:
    """kafka-python ``NewTopic`` objects for the deployment's topics not in ``existing`` (broker names)."""
    from kafka.admin import NewTopic

    names, parts = topic_names(deployment), topic_partitions(deployment)
    return [
        NewTopic(names[t], parts[t], replication, topic_configs=TOPICS[t].config())
        for t in names
        if names[t] not in existing
    ]


def ensure_topics(
    bootstrap: str, deployment: Deployment, timeout: float = 30.0, replication: int = 1
) -> dict[str, str]:
    """Create the deployment's topics that are missing (``replication`` copies each); refuse existing
    ones with other partition counts. A broker that is still starting is waited for up to ``timeout``
    seconds: the admin client's own bootstrap retries with backoff until then."""
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    from pipeline.connections import check_broker_listener

    names = topic_names(deployment)
    parts = topic_partitions(deployment)
    # a TLS client at a plain listener would wait for ever, a plain one at a TLS gate until the
    # timeout
    check_broker_listener(bootstrap)
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        client_id="dpstream-admin",
        bootstrap_timeout_ms=int(timeout * 1000),
    )
    try:
        missing = new_topics(deployment, set(admin.list_topics()), replication)
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them meanwhile
        described = {
            d.get("name", d.get("topic")): len(d["partitions"])
            for d in admin.describe_topics(list(names.values()))
        }
        changed = {
            name: (got, parts[logical])
            for logical, name in names.items()
            if (got := described.get(name)) is not None and got != parts[logical]
        }
        if changed:
            detail = "; ".join(
                f"topic {name} has {got}, the configuration needs {need}"
                for name, (got, need) in changed.items()
            )
            raise PartitionCountChanged(
                f"configuration refused: topics.partitions: the deployment's topics exist with another partition "
                f"count ({detail}). A worker's checkpoint holds the users of its partition, so the count cannot "
                "change under a running deployment: set topics.partitions back, or start a new deployment"
            )
    finally:
        admin.close()
    return names
