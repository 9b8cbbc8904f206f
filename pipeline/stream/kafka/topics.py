"""Topic names and creation for a deployment (kafka-python admin client)."""

from __future__ import annotations

import time

from pipeline.connections import kafka_security
from pipeline.stream.kafka.codecs import TOPICS

__all__ = ["topic_names", "topic_partitions", "ensure_topics"]


PUBLIC_TOPICS = ("releases", "synthetic", "alerts")
# The public topics are the product and the fence's evidence (pipeline.stream.release.fence): Kafka's default
# retention (7 days) would delete old manifests, and with them what a wiped state is checked against.
KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


def topic_names(deployment) -> dict[str, str]:
    """Logical topic -> broker topic name (``<prefix>.<deployment>.<topic>``)."""
    prefix = deployment.topics.prefix
    return {t: f"{prefix}.{deployment.name}.{t}" for t in TOPICS}


def topic_partitions(deployment) -> dict[str, int]:
    return {t: (deployment.topics.partitions if p == "config" else int(p)) for t, p in TOPICS.items()}


def ensure_topics(bootstrap: str, deployment, timeout: float = 30.0) -> dict[str, str]:
    """Create the deployment's topics that are missing; refuse existing ones with other partition counts."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    names = topic_names(deployment)
    parts = topic_partitions(deployment)
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, **kafka_security(), client_id="dpstream-admin")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(names[t], parts[t], 1, topic_configs=KEEP_FOREVER if t in PUBLIC_TOPICS else {})
                   for t in names if names[t] not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
        described = {d.get("name", d.get("topic")): len(d["partitions"]) for d in admin.describe_topics(list(names.values()))}
        for logical, name in names.items():
            got = described.get(name)
            if got is not None and got != parts[logical]:
                raise RuntimeError(f"topic {name} has {got} partitions, the configuration needs {parts[logical]}")
    finally:
        admin.close()
    return names
