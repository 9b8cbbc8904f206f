"""The broker's logs in memory, for the protocol tests that drive a coordinator by plain calls
(tests/test_release_coordinator.py, tests/test_ingest_coordinator.py), and the asyncio stores those
coordinators write through, on the session's real Redis."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from pipeline.stream.state.store_async import AsyncStateStore

CLOSE_MS = 1_800_000_000_000  # step t closes at CLOSE_MS + t seconds (public close times)


@dataclass
class Sent:
    key: bytes | None
    value: bytes
    timestamp_ms: int | None
    headers: tuple


class MemoryLog:
    """The broker's logs in memory. ``send`` is the producer interface the Checkpoint uses: the
    message is in the log at once, its acknowledgement is a future that ``ack`` (or ``auto_ack``)
    resolves."""

    def __init__(self, auto_ack: bool = True, logs=None):
        self.logs: dict[tuple[str, int], list[Sent]] = defaultdict(list) if logs is None else logs
        self.auto_ack = auto_ack
        self.unacked: list[asyncio.Future] = []

    def append(self, topic: str, partition: int, value: bytes, key=None, timestamp_ms=None,
               headers=()) -> None:
        self.logs[(topic, partition)].append(Sent(key, value, timestamp_ms, tuple(headers or ())))

    async def send(self, topic, value, key=None, partition=None, timestamp_ms=None, headers=None):
        self.append(topic, partition or 0, value, key, timestamp_ms, headers)
        future = asyncio.get_running_loop().create_future()
        if self.auto_ack:
            future.set_result(None)
        else:
            self.unacked.append(future)
        return future

    def ack(self, error: Exception | None = None) -> None:
        for future in self.unacked:
            future.set_exception(error) if error else future.set_result(None)
        self.unacked = []


@pytest.fixture
def store_of(redis_client):
    """Async stores on the session's real Redis (emptied per test); ``run`` closes them."""
    def make(dep) -> AsyncStateStore:
        client = aioredis.Redis(unix_socket_path=redis_client.socket_file)
        store = AsyncStateStore(client, dep.name)
        make.opened.append(store)
        return store
    make.opened = []
    return make


def run(main, store_of):
    """Run the test's coroutine, then close its stores in the same loop (an open client would keep
    the session's Redis server from shutting down)."""
    async def closing():
        try:
            return await main
        finally:
            for store in store_of.opened:
                await store.close()
    return asyncio.run(closing())
