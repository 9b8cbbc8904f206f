"""The one writer of a deployment's Redis state, as the stream jobs reach it from their event loop
(``redis.asyncio``): a Redis round trip in the commit path must not block the loop that also feeds the
consumer and the producer.

Same keys and encodings as the synchronous reader :class:`pipeline.stream.state.store.StateStore`
(they share :class:`~pipeline.stream.state.store.StoreLayout`). :meth:`AsyncStateStore.commit_step`
stores a step's record, ledger entries and pointer in one WATCH/MULTI/EXEC transaction and refuses any
step but the next one; the pointers, checkpoints and intake counts are written here too, and only here
(the identity claim at start is the synchronous store's).
"""

from __future__ import annotations

import json
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from pipeline.stream.state.store import StepRecord, StoreLayout

__all__ = ["AsyncStateStore"]


class AsyncStateStore(StoreLayout):
    """The one writer of a deployment's Redis state, from the jobs' event loops."""

    client_class = aioredis.Redis
    # A Redis restart takes a few seconds; a command retries for about 8 s (0.2, 0.4, 0.8, then 1 s
    # apart) before its ConnectionError ends the job (a supervisor restarts it). The synchronous client
    # rode out a restart the same way, but blocked the event loop while it waited.
    client_options = {"retry": Retry(ExponentialBackoff(cap=1.0, base=0.1), retries=10)}

    async def close(self) -> None:
        await self.r.aclose()

    async def _int(self, key: str) -> int:
        return self._as_int(await self.r.get(key))

    # -- releases (the releaser) -------------------------------------------------------------------
    async def last_released(self) -> int:
        return await self._int(self.keys.pointer("released"))

    async def load_step(self, step: int) -> StepRecord | None:
        return self._decode_step(step, await self.r.hgetall(self.keys.step(step)))

    async def latest_state(self) -> tuple[int, bytes | None]:
        """(last released step, mechanism state after it)."""
        last = await self.last_released()
        return (
            (0, None) if last == 0 else (last, await self.r.hget(self.keys.step(last), "__state__"))
        )

    async def commit_step(self, record: StepRecord, ledger: dict[str, dict[str, Any]]) -> None:
        """Atomically store step ``record.step`` and its ledger entries (``"<release>:<t>"`` -> entry);
        :class:`~pipeline.stream.state.store.StepAlreadyReleased` / ``StepOutOfOrder`` unless it is the next."""
        released_key, step_key = self.keys.pointer("released"), self.keys.step(record.step)
        ledger_key = self.keys.ledger
        async with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(released_key, step_key, ledger_key)
                    # The checks in one round trip (another connection: a write after the WATCH still fails
                    # the EXEC). Each round trip may wait behind the workers' checkpoint writes and their
                    # fsync (appendfsync always): one per check made this commit wait 0.3 s at n = 10^6.
                    async with self.r.pipeline(transaction=False) as reads:
                        reads.get(released_key)
                        reads.exists(step_key)
                        for key in ledger:
                            reads.hexists(ledger_key, key)
                        last, exists, *held = await reads.execute()
                    self._check_next(
                        record.step,
                        self._as_int(last),
                        bool(exists),
                        [key for key, h in zip(ledger, held) if h],
                    )
                    pipe.multi()
                    pipe.hset(step_key, mapping=self._step_mapping(record))
                    if ledger:
                        pipe.hset(ledger_key, mapping=self._ledger_mapping(ledger))
                    pipe.set(released_key, record.step)
                    await pipe.execute()
                    return
                except redis.WatchError:
                    continue  # someone else wrote meanwhile: re-check (we will then refuse)

    async def ledger(self) -> dict[str, dict[str, Any]]:
        return self._decode_ledger(await self.r.hgetall(self.keys.ledger))

    async def last_published(self) -> int:
        return await self._int(self.keys.pointer("published"))

    async def mark_published(self, step: int) -> None:
        """Everything of ``step`` reached the broker (acknowledged); a restart republishes the rest."""
        await self.r.set(self.keys.pointer("published"), step)

    async def partials_resume(self) -> int:
        return await self._int(self.keys.partials_resume)

    async def partials_log(self) -> str | None:
        """The topic id of the ``step-partials`` log the resume offset is in (None: not recorded)."""
        value = await self.r.get(self.keys.partials_log)
        return value.decode() if value else None

    async def set_partials_log(self, log_id: str) -> None:
        await self.r.set(self.keys.partials_log, log_id)

    async def set_partials_resume(self, offset: int, log_id: str | None = None) -> None:
        """Where a restarted releaser re-reads ``step-partials`` from (no unreleased partial before it),
        and, in the same transaction, which log (topic id) that offset is in."""
        if log_id is None:
            await self.r.set(self.keys.partials_resume, offset)
            return
        async with self.r.pipeline(transaction=True) as tx:
            tx.set(self.keys.partials_resume, offset)
            tx.set(self.keys.partials_log, log_id)
            await tx.execute()

    async def last_closing(self) -> int:
        return await self._int(self.keys.pointer("closing"))

    async def mark_closing(
        self, step: int, closed_at: int | None = None, marker: bytes | None = None
    ) -> None:
        """Close markers of ``step`` (public close time ``closed_at``, ms) are written to every
        reports partition;
        ``marker``: their value, kept so that a re-driven close re-sends the signed marker
        verbatim."""
        async with self.r.pipeline(transaction=True) as tx:
            if closed_at is not None:
                tx.hset(self.keys.close_times, str(step), int(closed_at))
            if marker is not None:
                tx.hset(self.keys.close_markers, str(step), marker)
            tx.set(self.keys.pointer("closing"), step)
            await tx.execute()

    async def close_time(self, step: int) -> int | None:
        """The public close time (ms) recorded for ``step``'s markers (None: not recorded)."""
        raw = await self.r.hget(self.keys.close_times, str(step))
        return None if raw is None else int(raw)

    async def close_marker(self, step: int) -> bytes | None:
        """The marker value written for ``step`` (None: closed without a kept marker)."""
        return await self.r.hget(self.keys.close_markers, str(step))

    # -- worker checkpoints ------------------------------------------------------------------------
    async def load_checkpoint(self, partition: int) -> bytes | None:
        return await self.r.get(self.keys.checkpoint(partition))

    async def save_checkpoint(
        self, partition: int, blob: bytes, kept: dict[int, bytes] | None = None, dropped=()
    ) -> None:
        """The partition's checkpoint, and in the same transaction its kept partials: ``kept`` (step ->
        blob) written, ``dropped`` steps deleted."""
        if not kept and not dropped:
            await self.r.set(self.keys.checkpoint(partition), blob)
            return
        async with self.r.pipeline(transaction=True) as tx:
            if kept:
                tx.hset(
                    self.keys.kept_partials(partition), mapping={str(t): v for t, v in kept.items()}
                )
            if dropped:
                tx.hdel(self.keys.kept_partials(partition), *[str(t) for t in dropped])
            tx.set(self.keys.checkpoint(partition), blob)
            await tx.execute()

    async def intake_of(self, partitions) -> dict[int, dict[str, Any]]:
        """The last intake counts written for ``partitions`` (absent: none yet); a worker compares them with
        the log it resumes on (``IngestCore.note_lost_log``)."""
        out = {}
        for p in partitions:
            raw = await self.r.hget(self.keys.intake, str(p))
            if raw is not None:
                out[int(p)] = json.loads(raw)
        return out

    async def save_intake(self, summaries: dict[int, dict[str, Any]]) -> None:
        """Store the partitions' intake counts (a snapshot each, replacing the previous one)."""
        if summaries:
            await self.r.hset(self.keys.intake, mapping=self._intake_mapping(summaries))
