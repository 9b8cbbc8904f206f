"""The Redis state as the stream jobs reach it from their event loop (``redis.asyncio``): a Redis
round trip in the commit path must not block the loop that also feeds the consumer and the producer.

Same keys and encodings as :class:`pipeline.stream.state.store.ReleaseStore` (they share
:class:`~pipeline.stream.state.store.StoreLayout`), and the same guarantees: :meth:`commit_step` stores a
step's record, ledger entries and pointer in one WATCH/MULTI/EXEC transaction and refuses any step
but the next one. Only what the jobs call at run time is here; identity checks at start and the
command-line tools use the synchronous store.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from pipeline.stream.state.store import StepRecord, StoreLayout

__all__ = ["AsyncReleaseStore"]


class AsyncReleaseStore(StoreLayout):
    client_class = aioredis.Redis
    # A Redis restart takes a few seconds; a command retries for about 8 s (0.2, 0.4, 0.8, then 1 s
    # apart) before its ConnectionError ends the job (a supervisor restarts it). The synchronous client
    # rode out a restart the same way, but blocked the event loop while it waited.
    client_options = {"retry": Retry(ExponentialBackoff(cap=1.0, base=0.1), retries=10)}

    async def close(self) -> None:
        await self.r.aclose()

    async def _int(self, name: str) -> int:
        return self._as_int(await self.r.get(self._k(name)))

    # -- releases (the releaser) -------------------------------------------------------------------
    async def last_released(self) -> int:
        return await self._int("released")

    async def load_step(self, step: int) -> StepRecord | None:
        return self._decode_step(step, await self.r.hgetall(self._k("step", step)))

    async def latest_state(self) -> tuple[int, bytes | None]:
        """(last released step, mechanism state after it)."""
        last = await self.last_released()
        return (0, None) if last == 0 else (last, await self.r.hget(self._k("step", last), "__state__"))

    async def commit_step(self, record: StepRecord, ledger: dict[str, dict[str, Any]]) -> None:
        """Atomically store step ``record.step`` and its ledger entries (see ``ReleaseStore.commit_step``)."""
        released_key, step_key, ledger_key = self._k("released"), self._k("step", record.step), self._k("ledger")
        async with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(released_key, step_key, ledger_key)
                    last = self._as_int(await pipe.get(released_key))
                    self._check_next(record.step, last, bool(await pipe.exists(step_key)),
                                     [key for key in ledger if await pipe.hexists(ledger_key, key)])
                    pipe.multi()
                    pipe.hset(step_key, mapping=self._step_mapping(record))
                    if ledger:
                        pipe.hset(ledger_key, mapping=self._ledger_mapping(ledger))
                    pipe.set(released_key, record.step)
                    await pipe.execute()
                    return
                except redis.WatchError:
                    continue  # someone else wrote meanwhile: re-check (we will then refuse)

    async def last_published(self) -> int:
        return await self._int("published")

    async def mark_published(self, step: int) -> None:
        await self.r.set(self._k("published"), step)

    async def partials_resume(self) -> int:
        return await self._int("partials-resume")

    async def set_partials_resume(self, offset: int) -> None:
        await self.r.set(self._k("partials-resume"), offset)

    async def last_closing(self) -> int:
        return await self._int("closing")

    async def mark_closing(self, step: int, closed_at: int | None = None) -> None:
        async with self.r.pipeline(transaction=True) as tx:
            if closed_at is not None:
                tx.hset(self._k("close-times"), str(step), int(closed_at))
            tx.set(self._k("closing"), step)
            await tx.execute()

    async def close_time(self, step: int) -> int | None:
        raw = await self.r.hget(self._k("close-times"), str(step))
        return None if raw is None else int(raw)

    # -- worker checkpoints ------------------------------------------------------------------------
    async def save_checkpoint(self, partition: int, blob: bytes) -> None:
        await self.r.set(self._k("checkpoint", partition), blob)

    async def save_intake(self, summaries: dict[int, dict[str, Any]]) -> None:
        if summaries:
            await self.r.hset(self._k("intake"), mapping=self._intake_mapping(summaries))
