"""Whether the topics a reader names exist, asked without creating them.

The embedded broker (Tansu) creates any topic a request names: a Metadata request for that topic
(even with ``allow_auto_topic_creation`` false, which it ignores), a ListOffsets or a Fetch of it.
A command that only reads would leave an empty topic behind for a misspelt deployment name, with
the broker's default partition count, which a later ``dpstream up`` of that name then refuses
(:class:`pipeline.stream.kafka.topics.PartitionCountChanged`). A Metadata request for *all*
topics names none and creates none, and kafka-python's ``partitions_for_topic`` sends exactly that
for a topic its cache does not know: the readers ask it first and name a topic to the broker only
once it is known to exist. A reader that needed the partitions anyway pays no extra round trip.

Under a broker's ACLs a topic the login may not describe is absent from that answer too; it is
reported as missing (docs/operations.md, "Exit codes").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["TopicsMissing", "existing_partitions", "broker_topics", "absent_deployment"]


class TopicsMissing(LookupError):
    """Topics a reader named that the broker does not have; nothing was read, nothing created.
    ``pipeline.cli`` says it in one line, exit code 2."""

    def __init__(self, broker: str, topics: list[str], line: str | None = None):
        self.broker, self.topics = broker, topics
        what = f"topic {topics[0]} does" if len(topics) == 1 else f"topics {', '.join(topics)} do"
        super().__init__(line or f"{what} not exist on broker {broker}")

    def of_deployment(self, deployment: str, names: Mapping[str, str]) -> TopicsMissing:
        """The same, said of deployment ``deployment`` (:func:`absent_deployment`)."""
        line = absent_deployment(deployment, self.broker, names, self.topics)
        return TopicsMissing(self.broker, self.topics, line)


def existing_partitions(consumer, broker: str, topics: Iterable[str]) -> dict[str, list[int]]:
    """Each topic's partitions as the broker's metadata of all topics lists them (kafka-python's
    ``partitions_for_topic``: the cache, else one request naming no topic); TopicsMissing naming
    every topic it does not list."""
    found = {topic: sorted(consumer.partitions_for_topic(topic) or ()) for topic in topics}
    missing = [topic for topic, parts in found.items() if not parts]
    if missing:
        raise TopicsMissing(broker, missing)
    return found


def broker_topics(bootstrap: str) -> set[str]:
    """Every topic name the broker lists (one metadata request for all topics; none created)."""
    from kafka import KafkaConsumer

    from pipeline.connections import kafka_security

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, **kafka_security(), enable_auto_commit=False
    )
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def absent_deployment(
    deployment: str, broker: str, names: Mapping[str, str], missing: list[str]
) -> str:
    """The line for a reader that found ``missing`` of deployment ``deployment``'s topics
    (``names``: logical -> broker name) absent: no deployment of that name when none of its topics
    exists (its ``deployment`` topic named), else which of them it lacks."""
    present = broker_topics(broker) & set(names.values())
    if not present:
        topic = names.get("deployment", missing[0])
        return f'no deployment "{deployment}" on broker {broker} (topic {topic} does not exist)'
    return (
        f'deployment "{deployment}" on broker {broker} lacks {", ".join(missing)} (its topics '
        "were not all created: `dpstream up` and deploy/create_topics.py create them)"
    )
