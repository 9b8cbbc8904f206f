"""Releaser (one instance): step partials -> noisy releases -> public topics.

Run through the command line: ``dpstream releaser --config config/sipp-poverty.yaml``.

The release protocol — assemble the partials of a step, run the mechanisms, commit the complete
release to Redis before publishing anything, republish committed steps after a restart, close steps
by command or deadline — is :class:`pipeline.stream.releaser.coordinator.ReleaseCoordinator`. This module is
its Kafka side: it feeds the coordinator from the topics it reads (``step-partials``, ``control``)
and gives it a producer and the asyncio Redis store.

At start: the configuration is checked against the one the Redis state was created under
(:mod:`pipeline.stream.state.identity`, exit code 2), and before the first release the ``releases`` topic
is checked for releases the state does not know (:mod:`pipeline.stream.releaser.fence`, exit code 4).

Transport: an aiokafka group consumer (:mod:`pipeline.stream.kafka.bulk_consumer`) and producer. Positions come
from Redis (the partials resume offset) in the assignment callback (docs/streaming.md, "Processes").
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition

from pipeline import descriptor
from pipeline.connections import check_broker_listener
from pipeline.stream.control.signatures import job_keys
from pipeline.stream.kafka.bulk_consumer import BulkConsumer
from pipeline.stream.kafka.consumer_lag import start_lag_monitor
from pipeline.stream.kafka.job_producer import make_producer
from pipeline.stream.kafka.log_end import log_ends_async
from pipeline.stream.kafka.log_identity import topic_ids_async
from pipeline.stream.kafka.topics import RELEASER, group_id, read_by
from pipeline.stream.process.metrics import serve_metrics
from pipeline.stream.process.runtime import Runtime
from pipeline.stream.process.supervision import closed_within, run_job, supervise
from pipeline.stream.releaser.coordinator import ReleaseCoordinator
from pipeline.stream.releaser.fence import read_release_stamps
from pipeline.stream.state.commit_order import CommitOrder
from pipeline.stream.state.identity import establish_identity

log = logging.getLogger("dpstream.releaser")


class Releaser:
    """The releaser process: consumer, producer and Redis around one :class:`ReleaseCoordinator`."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.names = rt.names
        self.group = group_id(rt.deployment, RELEASER)
        self.coordinator: ReleaseCoordinator | None = None  # built in run(): it reads Redis
        self._control_done = 0  # next control offset to handle (lag gauge only)

    @property
    def running(self) -> ReleaseCoordinator:
        """The coordinator, built in run() before the consumer starts (every callback runs after)."""
        if self.coordinator is None:
            raise RuntimeError("the releaser's coordinator is not built yet")
        return self.coordinator

    async def _log_end(self, topic: str) -> int | None:
        """End offset of partition 0 of ``topic`` (a broker silent past the bound ends the process)."""
        tp = TopicPartition(
            topic, 0
        )  # the true end: the embedded broker's ListOffsets answer is short
        return (await log_ends_async(self.rt.broker, [tp])).get(tp)

    async def _log_id(self, topic: str) -> str | None:
        """The broker's topic id of ``topic`` (None: it has none): which log an offset is in."""
        return (await topic_ids_async(self.rt.broker, [topic]))[topic]

    async def _on_assign(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        """Positions from Redis, whatever the group committed: partials from the first one of a step not
        yet released (the resume offset), control commands from the start (closing is idempotent)."""
        positions = {}
        for tp in tps:
            if tp.topic == self.names["step-partials"]:
                positions[tp] = await self.running.on_assign_partials()
            elif tp.topic == self.names["control"]:
                positions[tp] = 0
        return positions

    async def _on_revoke(self, tps: set[TopicPartition]) -> None:
        pass  # the assembler keeps what it has: re-read chunks are duplicates, which it ignores

    def _handled(self) -> dict[TopicPartition, int]:
        return {
            TopicPartition(self.names["step-partials"], 0): self.running.last_partial_offset + 1,
            TopicPartition(self.names["control"], 0): self._control_done,
        }

    async def _consume(self, consumer: BulkConsumer) -> None:
        coordinator = self.running
        async for batch in consumer.batches():
            for tp, messages in batch.items():
                if tp.topic == self.names["step-partials"]:
                    if any([coordinator.take_partial(m.offset, m.key, m.value) for m in messages]):
                        await coordinator.release_ready_steps()
                elif tp.topic == self.names["control"]:
                    for m in messages:
                        await coordinator.on_control(m.value, m.timestamp, m.offset)
                    self._control_done = messages[-1].offset + 1

    async def _fence(self) -> None:
        """Before the first release: refuse (StateLost: exit code 4) when ``releases`` holds releases this
        state does not know — the Redis state was lost or replaced, and releasing would redraw noise."""
        stamps = await read_release_stamps(self.rt.broker, self.names["releases"])
        released = await self.running.check_fence(stamps)
        log.info(
            "fence passed: %d manifest(s) on %s, none unknown to this state (instance %s, released through "
            "step %d)",
            len(stamps),
            self.names["releases"],
            self.running.engine.instance,
            released,
        )

    async def _publish_descriptor(self, producer, instance: str, keys) -> None:
        """The public deployment descriptor (pipeline.descriptor): n, labels and parameters for the
        analysts' commands, the public keys closes verify with for the operator's dry run; the
        same bytes on every start under the same configuration and keys."""
        record = descriptor.build(self.rt.deployment, self.rt.roster.ids, instance, keys)
        await producer.send_and_wait(
            self.names["deployment"],
            descriptor.encode(record),
            key=descriptor.KEY.encode(),
            partition=0,
        )

    async def run(self) -> None:
        rt = self.rt
        # A restart must find the privacy-relevant configuration (budget plan included) the state was created
        # under; a changed one is refused before anything runs (ConfigurationChanged: exit code 2).
        check_broker_listener(rt.broker)  # a protocol mismatch: one line, not a client's retries
        identity = establish_identity(rt.deployment, rt.roster.ids, rt.store(), "releaser")
        # Close commands count only with the curator's signature; deadline closes are signed with
        # the
        # deadline key (exit code 2 when a key is missing).
        verifier, deadline = job_keys(rt.deployment, identity.fingerprint, "releaser")
        serve_metrics(rt.metrics_port)
        start_lag_monitor(rt)  # one process exports the lag, so each series exists once
        store = rt.async_store()
        producer = make_producer(rt.broker, linger_ms=2)
        self.coordinator = await ReleaseCoordinator.create(
            rt.deployment,
            rt.roster.n,
            identity.instance,
            store,
            CommitOrder(producer),
            self.names,
            self._log_end,
            verifier=verifier,
            deadline_signer=deadline,
            log_id=self._log_id,
        )
        consumer = BulkConsumer(
            rt.broker,
            self.group,
            [self.names[t] for t in read_by(RELEASER)],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        await producer.start()
        await consumer.start()
        log.info(
            "releaser started: group %s, engine at step %d",
            self.group,
            self.coordinator.engine.step,
        )
        try:
            # The broker watchdog runs from here on, through the startup steps too: a broker lost
            # while the descriptor is published or the fence reads would otherwise hold the job
            # for its clients' request timeouts (40 s, 120 s) instead of the bound.
            await supervise(
                [asyncio.create_task(consumer.broker_watchdog())],
                "releaser",
                startup=lambda: self._start(consumer, producer, identity.instance, verifier.keys),
            )
        finally:
            await closed_within(
                {
                    "the consumer": consumer.stop(),
                    "the producer": producer.stop(),
                    "the Redis store": store.close(),
                }
            )
            log.info("releaser stopped")

    async def _start(
        self, consumer: BulkConsumer, producer, instance: str, keys
    ) -> list[asyncio.Task]:
        """The startup steps in order; then the releaser's loops (any failing ends the process)."""
        await self._publish_descriptor(producer, instance, keys)
        await self._fence()
        # republishes first, under the same lock as releasing
        await self.running.release_ready_steps()
        # before any new close command: markers go out in step order
        await self.running.redrive_closes()
        return [
            asyncio.create_task(self._consume(consumer)),
            asyncio.create_task(_every(0.5, self.running.tick)),
            asyncio.create_task(consumer.commit_loop(self._handled)),
        ]


async def _every(seconds: float, fn) -> None:
    """Run ``fn`` every ``seconds`` (closing by deadline, republishing after a rebalance)."""
    while True:
        await asyncio.sleep(seconds)
        await fn()


def serve(rt: Runtime, loglevel: str = "info") -> None:
    """Run the releaser on a loaded configuration and endpoints until SIGTERM/SIGINT or a failure."""
    run_job(lambda: Releaser(rt).run(), loglevel)


def main(argv: list[str] | None = None) -> None:
    rt, loglevel = Runtime.from_args("releaser", argv)
    serve(rt, loglevel)


if __name__ == "__main__":
    main()
