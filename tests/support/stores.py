"""Tests that set up Redis state write it the way the jobs do, through the one writer
(:class:`pipeline.stream.state.store_async.AsyncStateStore`), from synchronous test code."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from pipeline.stream.state.store import StateStore
from pipeline.stream.state.store_async import AsyncStateStore


class WritableStore(StateStore):
    """The synchronous reader plus the asyncio store's writes, each run to completion on a fresh client
    connected like the reader's."""

    def _write(self, name: str, *args):
        given = self.r.connection_pool.connection_kwargs
        kwargs = {k: given[k] for k in ("host", "port", "db", "username", "password") if k in given}
        if "path" in given:
            kwargs["unix_socket_path"] = given["path"]

        async def run():
            client = aioredis.Redis(**kwargs)
            try:
                return await getattr(AsyncStateStore(client, self.deployment), name)(*args)
            finally:
                await client.aclose()

        return asyncio.run(run())

    def commit_step(self, record, ledger):
        return self._write("commit_step", record, ledger)

    def mark_published(self, step):
        return self._write("mark_published", step)

    def mark_closing(self, step):
        return self._write("mark_closing", step)

    def set_partials_resume(self, offset):
        return self._write("set_partials_resume", offset)

    def save_checkpoint(self, partition, blob, kept=None, dropped=()):
        return self._write("save_checkpoint", partition, blob, kept, dropped)

    def save_intake(self, summaries):
        return self._write("save_intake", summaries)
