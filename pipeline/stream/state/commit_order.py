"""The commit order of the stream processes: publish, await the broker's acknowledgements, then
write to Redis that it is done.

A Redis write that says "these messages are out" — a worker's checkpoint (step closed, reports up
to its marker handled), the releaser's ``published`` and ``closing`` pointers — may only follow the
broker's acknowledgement of those messages: written earlier, a crash in between would lose them
(a restart resumes after what Redis says is done and never sends them again). Sending again after a
crash that came before the write is harmless: every message has a deterministic key and the same
bytes, and consumers deduplicate.

:class:`CommitOrder` is that order, and nothing else: :meth:`CommitOrder.begin` opens a
:class:`Batch` that collects the acknowledgement futures of the messages handed to the producer and
runs the Redis writes only once all of them are acknowledged. A batch belongs to one operation (a
fetch's closes, a step's publication, a step's close markers): concurrent operations never wait on,
or commit for, each other's messages. Any producer whose ``send`` is a coroutine returning the
delivery future (``AIOKafkaProducer.send``) will do; tests pass an in-memory one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

__all__ = ["Publisher", "CommitOrder", "Batch"]


class Publisher(Protocol):
    """Hands a message to the broker; the returned future resolves when the broker acknowledged it."""

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list | None = None,
    ) -> Awaitable[Any]: ...


class CommitOrder:
    def __init__(self, publisher: Publisher):
        self.publisher = publisher

    def begin(self) -> Batch:
        """A new batch of messages whose acknowledgements the batch's commit awaits."""
        return Batch(self.publisher)


class Batch:
    def __init__(self, publisher: Publisher):
        self.publisher = publisher
        self._pending: list[Awaitable[Any]] = []

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int = 0,
        timestamp_ms: int | None = None,
        headers: list | None = None,
    ) -> None:
        """Hand one message to the producer; its acknowledgement is awaited before the commit's writes."""
        self._pending.append(
            await self.publisher.send(
                topic,
                value=value,
                key=key,
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=headers,
            )
        )

    async def send_many(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes, list | None]],
        partition: int = 0,
    ) -> None:
        """Hand ``(key, value, headers)`` messages to one partition, in order, a producer batch at a
        time when the producer builds them (``AIOKafkaProducer.create_batch``, ``send_batch``): a
        message costs the batch's append, not a send of its own (a send is ~60 µs of the event
        loop: the 10^6 dead letters of a file sent twice took ~70 s). Each batch's acknowledgement
        is awaited before the commit's writes, as a message's is."""
        if not records:  # the usual fetch: nothing rejected
            return
        create = getattr(self.publisher, "create_batch", None)
        send_batch = getattr(self.publisher, "send_batch", None)
        if create is None or send_batch is None:
            for key, value, headers in records:
                await self.send(topic, value, key=key, partition=partition, headers=headers)
            return

        async def ship(batch) -> None:
            if batch.record_count():
                batch.close()
                self._pending.append(await send_batch(batch, topic, partition=partition))

        batch = create()
        for key, value, headers in records:
            listed = headers or []
            added = batch.append(timestamp=None, key=key, value=value, headers=listed)
            if added is None and batch.record_count():  # full: it goes, the message opens the next
                await ship(batch)
                batch = create()
                added = batch.append(timestamp=None, key=key, value=value, headers=listed)
            if added is None:
                # larger than a batch by itself: sent alone (the producer refuses what is too large)
                batch = create()
                await self.send(topic, value, key=key, partition=partition, headers=headers)
        await ship(batch)

    async def acknowledged(self) -> None:
        """Wait until the broker acknowledged every message of this batch sent so far (raises if one failed)."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)

    async def commit(self, *writes: Callable[[], Awaitable[Any]]) -> None:
        """Wait for every acknowledgement, then run the Redis ``writes`` in order."""
        await self.acknowledged()
        for write in writes:
            await write()
