"""Ingest worker: reports -> per-user numpy state -> step partials.

Run through the command line (``pipeline.stream.process.runtime`` lists the job's arguments):
``dpstream worker --config config/sipp-poverty.yaml``. Start up to as many as there are partitions.

* ``reports`` (keyed by user): runs of reports are parsed and applied in bulk; a close marker for
  step t (header ``dpstream-control: close``) closes step t in that partition: impute, compute the
  partial aggregates, publish them to ``step-partials``, checkpoint state + marker offset to Redis.
* ``feedback`` (co-partitioned with reports): heavy-hitter flags of step t, applied before step
  t+1 closes (the close waits for them).
* ``repartition`` (co-partitioned with reports): reports of this partition's users that arrived on
  other partitions, and their forwarded-through markers; a close waits for those of every source
  (:mod:`pipeline.stream.ingest.repartition`). Reports of other partitions' users are forwarded there.
* rejected reports -> ``dead-letter`` with the original bytes and a reason.

The ingest protocol — resume positions from the Redis checkpoints, a lost log noticed and recorded,
the order of a fetch (publish partials, forwards and dead letters; await the acknowledgements; then
write the checkpoints) — is :class:`pipeline.stream.ingest.coordinator.IngestCoordinator`. This module
is its Kafka side: it feeds the coordinator the fetches and gives it a producer and the asyncio Redis store.

Transport: a plain aiokafka group consumer reading whole fetches (:mod:`pipeline.stream.kafka.bulk_consumer`) and
an aiokafka producer; the hot path is vectorised per fetch (docs/streaming.md, "Processes").
Positions come only from the Redis checkpoints (read in the assignment callback); the offsets this
worker commits are for lag monitoring, never read back.
"""

from __future__ import annotations

import asyncio
import gc
import logging

from aiokafka import TopicPartition

from pipeline.connections import check_broker_listener
from pipeline.stream.control.signatures import job_keys
from pipeline.stream.ingest.coordinator import IngestCoordinator
from pipeline.stream.ingest.core import IngestCore
from pipeline.stream.kafka.bulk_consumer import INGEST_FETCH_MAX_WAIT_MS, BulkConsumer
from pipeline.stream.kafka.job_producer import make_producer
from pipeline.stream.kafka.log_end import log_ends_async
from pipeline.stream.kafka.log_identity import topic_ids_async
from pipeline.stream.kafka.topics import INGEST, group_id, read_by
from pipeline.stream.process.metrics import serve_metrics, unexport_releaser_series
from pipeline.stream.process.runtime import Runtime
from pipeline.stream.process.supervision import closed_within, run_job, supervise
from pipeline.stream.state.commit_order import CommitOrder
from pipeline.stream.state.fingerprint import fingerprint, privacy_config
from pipeline.stream.state.identity import establish_identity

log = logging.getLogger("dpstream.worker")


class IngestWorker:
    """One ingest process: the consumer, the producer and Redis around one :class:`IngestCoordinator`."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.names = rt.names
        self.store = rt.store()
        # Aggregators are rebuilt from this configuration around restored state: it must be the one the
        # state was created under (ConfigurationChanged: exit code 2).
        check_broker_listener(rt.broker)  # a protocol mismatch: one line, not a client's retries
        # Close markers count only with the curator's (or the deadline key's) signature over this
        # deployment and configuration: a producer cannot close a step (exit code 2 without the
        # public key). With no identity yet (the login's first read), the keys are checked before
        # waiting for the releaser's: a missing key is one line at once, not after the wait.
        if self.store.identity() is None:
            job_keys(
                rt.deployment, fingerprint(privacy_config(rt.deployment, rt.roster.ids)), "worker"
            )
        identity = establish_identity(rt.deployment, rt.roster.ids, self.store, "worker")
        verifier, _ = job_keys(rt.deployment, identity.fingerprint, "worker")
        self.core = IngestCore(
            rt.deployment, rt.roster, self.names, store=self.store, verifier=verifier
        )
        self.consumer = BulkConsumer(
            rt.broker,
            group_id(rt.deployment, INGEST),
            [self.names[t] for t in read_by(INGEST)],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            fetch_max_wait_ms=INGEST_FETCH_MAX_WAIT_MS,
        )
        self.producer = make_producer(rt.broker, linger_ms=5)
        self.redis = rt.async_store()  # checkpoint writes from the event loop
        # partials and dead letters acknowledged, then Redis
        self.coordinator = IngestCoordinator(
            self.core,
            self.redis,
            CommitOrder(self.producer),
            self._log_ends,
            seek=lambda tp, offset: self.consumer.consumer.seek(tp, offset),
            log_ids=lambda topics: topic_ids_async(rt.broker, topics),
        )
        # The roster, its id index and the loaded modules live as long as the process: frozen out of
        # the cyclic collector's sight, so the full passes the fetches' allocations trigger skip them.
        gc.freeze()

    async def _log_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        # True log ends (the embedded broker's ListOffsets answer is short by the rest of the last
        # batch, which would look like a lost log when the checkpoint's marker is in that batch).
        return await log_ends_async(self.rt.broker, tps)

    async def _on_assign(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        return await self.coordinator.on_assign(tps)

    async def _on_revoke(self, tps: set[TopicPartition]) -> None:
        await self.coordinator.on_revoke(tps)

    def _handled(self) -> dict[TopicPartition, int]:
        return self.coordinator.handled(self.consumer.consumer.assignment())

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        if self.rt.metrics_port:
            unexport_releaser_series()
            serve_metrics(self.rt.metrics_port)
        await self.producer.start()
        await self.consumer.start()
        log.info("worker started: group %s", self.consumer.group_id)
        try:
            if self.names["repartition"] not in await self.consumer.consumer.topics():
                # without it no close could ever gather the other partitions' forwarded-through markers
                raise RuntimeError(
                    f"topic {self.names['repartition']} does not exist: create the deployment's topics "
                    "(deploy/create_topics.py, or `dpstream up`) before starting workers"
                )
            await supervise(
                [
                    asyncio.create_task(self._consume()),
                    asyncio.create_task(self.consumer.commit_loop(self._handled)),
                    asyncio.create_task(self.consumer.broker_watchdog()),
                ],
                "worker",
                drain=self._finish_fetch,
            )
        finally:
            await closed_within(
                {
                    "the consumer": self.consumer.stop(),
                    "the producer": self.producer.stop(),
                    "the Redis store": self.redis.close(),
                }
            )
            log.info("worker stopped")

    async def _finish_fetch(self) -> None:
        """On SIGTERM: let the fetch in hand finish (its partials, checkpoints and intake counts written)."""
        async with self.coordinator.busy:
            pass

    async def _consume(self) -> None:
        # aiokafka's records carry .offset, .value and .headers, which is all a Record is
        async for batch in self.consumer.batches():
            await self.coordinator.handle(batch)


def serve(rt: Runtime, loglevel: str = "info") -> None:
    """Run a worker on a loaded configuration and endpoints until SIGTERM/SIGINT or a failure."""
    run_job(lambda: IngestWorker(rt).run(), loglevel)


def main(argv: list[str] | None = None) -> None:
    rt, loglevel = Runtime.from_args("worker", argv)
    serve(rt, loglevel)


if __name__ == "__main__":
    main()
