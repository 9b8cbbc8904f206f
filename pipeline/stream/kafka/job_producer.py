"""The producer both stream jobs publish with (their partials, releases, dead letters and markers)."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from pipeline.connections import kafka_security
from pipeline.stream.process.limits import MAX_MESSAGE_BYTES

__all__ = ["make_producer"]


def make_producer(bootstrap: str, linger_ms: int) -> AIOKafkaProducer:
    """Acknowledged by every in-sync replica: a checkpoint or a ledger entry follows some sends."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        acks="all",
        linger_ms=linger_ms,
        max_request_size=MAX_MESSAGE_BYTES,
        max_batch_size=1 << 20,
    )
