"""Topic names and creation for a deployment (kafka-python admin client)."""

from __future__ import annotations

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


def ensure_topics(bootstrap: str, deployment, timeout: float = 30.0, replication: int = 1) -> dict[str, str]:
    """Create the deployment's topics that are missing (``replication`` copies each); refuse existing
    ones with other partition counts. A broker that is still starting is waited for up to ``timeout``
    seconds: the admin client's own bootstrap retries with backoff until then."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    names = topic_names(deployment)
    parts = topic_partitions(deployment)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="dpstream-admin",
                             bootstrap_timeout_ms=int(timeout * 1000))
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(names[t], parts[t], replication, topic_configs=KEEP_FOREVER if t in PUBLIC_TOPICS else {})
                   for t in names if names[t] not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them meanwhile
        described = {d.get("name", d.get("topic")): len(d["partitions"]) for d in admin.describe_topics(list(names.values()))}
        for logical, name in names.items():
            got = described.get(name)
            if got is not None and got != parts[logical]:
                raise RuntimeError(f"topic {name} has {got} partitions, the configuration needs {parts[logical]}")
    finally:
        admin.close()
    return names
