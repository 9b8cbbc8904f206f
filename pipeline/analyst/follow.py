"""``dpstream alerts --follow``: the alerts as they are published, after those already there.

The ``alerts`` topic is read from its beginning by one assigned consumer (no group, nothing
committed) that never stops; an alert whose (release, step) was already shown is skipped (a
republished alert has the same key and bytes), so nothing published between the first read and the
follow is lost or shown twice. Each new alert is added to the reader's store before it is put in
words, so "flag j of k" counts every earlier flag.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["follow_alerts"]


def follow_alerts(
    reader,
    broker: str,
    topic: str,
    shown: set[tuple[str, int]],
    show: Callable[[dict], None],
    release: str | None = None,
    poll_ms: int = 500,
) -> None:
    """``show(alert)`` for each alert of ``topic`` (of ``release``) not in ``shown``, forever."""
    import orjson
    from kafka import KafkaConsumer, TopicPartition

    from pipeline.connections import kafka_security

    consumer = KafkaConsumer(
        bootstrap_servers=broker,
        **kafka_security(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        while True:
            for messages in consumer.poll(timeout_ms=poll_ms).values():
                for msg in messages:
                    alert = orjson.loads(msg.value)
                    key = (alert["release"], int(alert["step"]))
                    if key in shown or (release is not None and key[0] != release):
                        continue
                    shown.add(key)
                    reader.store.add_alert(msg.value)
                    for found in reader.alerts(key[0], key[1]):
                        show(found)
    finally:
        consumer.close()
