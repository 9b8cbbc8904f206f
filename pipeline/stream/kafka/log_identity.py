"""Which log a topic is: the broker's topic id, so that a lost or replaced log is found by its identity,
not by comparing offsets.

A position saved in Redis (a worker's checkpoint offset, the releaser's partials resume offset) is
an offset *in one log*. A broker that loses its logs (a memory-only broker restarted) and creates the
topics again starts them at offset 0; by the time a restarted job is assigned, the new log may
already have grown to or past the saved offset (workers re-send partials, producers send reports),
so "the log ends before my offset" cannot tell a new log from the old one. Kafka gives every topic a
random id when it is created (KIP-516, Metadata v10+; Apache Kafka since 2.8); the embedded broker
(Tansu) does too, and keeps it with a durable log: it changes exactly when the log is a new one.

The jobs save the topic id with each position and compare it at assignment
(:class:`pipeline.stream.ingest.coordinator.IngestCoordinator`,
:class:`pipeline.stream.releaser.coordinator.ReleaseCoordinator`); a broker without topic ids
(the all-zero id) gives ``None`` and the offset comparison is kept as the only evidence.

A broker that does not answer is not "nothing was lost": :func:`topic_ids_async` retries for
:func:`broker_wait_seconds` and then raises :class:`BrokerUnreachable`, which ends the job (its
supervisor restarts it) instead of resuming at a position whose log it could not check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from pipeline.connections import kafka_security

__all__ = [
    "BrokerUnreachable",
    "BROKER_WAIT_SECONDS",
    "NO_TOPIC_ID",
    "broker_wait_seconds",
    "topic_ids",
    "topic_ids_async",
]

log = logging.getLogger("dpstream.log_identity")

# How long a job waits for the broker to answer before it exits (docs/streaming.md, "Supervision");
# DPSTREAM_BROKER_WAIT_SECONDS overrides it.
BROKER_WAIT_SECONDS = 60.0


def broker_wait_seconds() -> float:
    return float(os.environ.get("DPSTREAM_BROKER_WAIT_SECONDS") or BROKER_WAIT_SECONDS)


NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"  # a broker without topic ids (before KIP-516)


class BrokerUnreachable(RuntimeError):
    """The broker did not answer within the bound: the job cannot tell whether its logs were lost."""


def topic_ids(bootstrap: str, topics, timeout: float = 10.0) -> dict[str, str | None]:
    """Topic name -> the broker's topic id (None: the broker has none, or the topic does not exist)."""
    from kafka import KafkaAdminClient

    topics = sorted(set(topics))
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        client_id="dpstream-log-identity",
        bootstrap_timeout_ms=int(timeout * 1000),
        request_timeout_ms=int(timeout * 1000),
    )
    try:
        described = admin.describe_topics(topics)
    finally:
        admin.close()
    out: dict[str, str | None] = {name: None for name in topics}
    for d in described:
        tid = d.get("topic_id")
        if d.get("error_code", 0) == 0 and tid and str(tid) != NO_TOPIC_ID:
            out[d.get("name", d.get("topic"))] = str(tid)
    return out


async def topic_ids_async(
    bootstrap: str, topics, bound: float | None = None
) -> dict[str, str | None]:
    """:func:`topic_ids` from a job's event loop, retried for ``bound`` seconds (default:
    :func:`broker_wait_seconds`); BrokerUnreachable after."""
    bound = broker_wait_seconds() if bound is None else bound
    deadline, delay = time.monotonic() + bound, 0.5
    while True:
        try:
            return await asyncio.to_thread(topic_ids, bootstrap, list(topics))
        except Exception as err:  # noqa: BLE001 - any failure to answer is the same case: retry, then give up
            if time.monotonic() + delay > deadline:
                raise BrokerUnreachable(
                    f"the broker at {bootstrap} did not tell the identity of "
                    f"{', '.join(sorted(set(topics)))} within {bound:g} s ({err}); exiting "
                    "rather than resuming at positions in logs it could not check"
                ) from err
            log.warning(
                "could not read the topic ids of %s (%s); retrying",
                ", ".join(sorted(set(topics))),
                err,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
