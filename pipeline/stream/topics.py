"""Topic names and creation for a deployment (kafka-python admin client)."""

from __future__ import annotations

import time

from pipeline.stream.messages import TOPICS

__all__ = ["topic_names", "topic_partitions", "ensure_topics", "read_partition"]


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
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="dpstream-admin")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(names[t], parts[t], 1) for t in names if names[t] not in existing]
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


def read_partition(bootstrap: str, topic: str, partition: int, offset: int = 0,
                   timeout: float = 60.0) -> tuple[list[tuple[int, bytes | None, bytes]], int]:
    """Messages ``(offset, key, value)`` of one partition from ``offset`` to its current end, read
    directly (no consumer group, nothing committed), and that end offset.

    The stream jobs use it where positions must come from Redis, not from Faust: Faust repositions a
    newly assigned partition at the group's committed offset after the assignment callback, undoing
    a seek made there.
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap.split(","), enable_auto_commit=False,
                             max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        if offset >= end:
            return [], end
        consumer.seek(tp, offset)
        out, deadline = [], time.monotonic() + timeout
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=200).values():
                out += [(m.offset, m.key, m.value) for m in msgs if m.offset < end]
        return out, end
    finally:
        consumer.close()
