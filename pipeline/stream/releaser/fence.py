"""The fence: never release a step whose release is already public but unknown to the state in Redis.

A step is released once: its noise is drawn, committed to Redis, then published. If the Redis state
is lost (an embedded Redis in a deleted directory, a flush, an older backup restored) while the
public ``releases`` topic keeps its manifests (durable Kafka), a releaser starting from the empty
state would release the same steps again under the same keys with fresh noise: readers would hold
two independent draws of one statistic, a spend the new ledger would not show.

Before its first release the releaser reads the whole ``releases`` topic and refuses to start
(:class:`pipeline.stream.state.identity.StateLost`, exit code 4) when it holds a manifest with a step
after the state's last released step, or stamped with an instance id other than the state's. The
opposite case (the state knows steps the topic lacks: a memory-only broker restarted) is fine:
the releaser republishes them from Redis, byte for byte.

Reading to the end: the embedded broker may report a partition's end offset as the start of its
last record batch + 1, so the reported end only says where the log is at least; the reader keeps
polling until nothing more arrives for ``idle`` seconds after reaching it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.connections import kafka_security
from pipeline.stream.process.limits import MAX_MESSAGE_BYTES
from pipeline.stream.state.identity import StateLost

__all__ = ["ReleaseStamp", "read_release_stamps", "unknown_releases", "check_fence"]

log = logging.getLogger("dpstream.fence")


@dataclass(frozen=True)
class ReleaseStamp:
    """What the fence needs of one manifest on the topic (all public)."""

    release: str
    step: int
    instance: str | None  # None: a manifest written before instances were stamped


def _stamp(value: bytes) -> ReleaseStamp | None:
    try:
        manifest = orjson.loads(value)
        return ReleaseStamp(
            str(manifest["release"]), int(manifest["step"]), manifest.get("instance")
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


async def read_release_stamps(
    bootstrap: str, topic: str, idle: float = 0.5, timeout: float = 120.0
) -> list[ReleaseStamp]:
    """Every manifest on partition 0 of ``topic``, read from the start until ``idle`` seconds pass
    without a record after the reported end; raises TimeoutError after ``timeout`` seconds."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        if end == 0:  # an empty log: a non-empty one reports at least 1
            return []
        await consumer.seek_to_beginning(tp)
        stamps, skipped, next_offset = [], 0, 0
        deadline, quiet_since = time.monotonic() + timeout, None
        while True:
            records = (await consumer.getmany(tp, timeout_ms=100)).get(tp, [])
            for record in records:
                stamp = _stamp(record.value)
                if stamp is None:
                    skipped += 1
                else:
                    stamps.append(stamp)
                next_offset = record.offset + 1
            now = time.monotonic()
            if records or next_offset < end:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= idle:
                break
            if now > deadline:
                raise TimeoutError(
                    f"reading {topic} did not finish within {timeout:.0f} s (at offset {next_offset}, "
                    f"reported end {end})"
                )
        if skipped:
            log.warning("%s: %d message(s) that are not manifests ignored", topic, skipped)
        return stamps
    finally:
        await consumer.stop()


def unknown_releases(
    stamps: list[ReleaseStamp], instance: str | None, last_released: int
) -> list[ReleaseStamp]:
    """The manifests a state (``instance``, released through ``last_released``) cannot have written."""
    return [
        s
        for s in stamps
        if s.step > last_released or (s.instance is not None and s.instance != instance)
    ]


def check_fence(
    stamps: list[ReleaseStamp], instance: str | None, last_released: int, topic: str
) -> None:
    """Raise :class:`StateLost` when ``topic`` holds releases this state does not know."""
    unknown = unknown_releases(stamps, instance, last_released)
    if not unknown:
        return
    steps = sorted({s.step for s in unknown})
    others = sorted({s.instance for s in unknown if s.instance not in (None, instance)})
    raise StateLost(
        f"refusing to release: {topic} already holds {len(unknown)} release manifest(s) this state does not know "
        f"(steps {steps[0]}..{steps[-1]}"
        + (f", instance(s) {', '.join(others)}" if others else "")
        + f"; this state: instance {instance}, last released step {last_released}). The Redis state was lost, "
        "wiped or restored from an older backup. Releasing again would draw fresh noise for steps already public "
        "(a second, unaccounted spend). Restore the Redis state from a backup taken after the last published step "
        "(docs/streaming.md, 'Backup and restore'), or start a new deployment with a new name and budget."
    )
