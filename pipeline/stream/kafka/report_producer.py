"""Producing reports and control commands (the simulator, the demo; report files go through
:mod:`pipeline.producer`).

Single reports are keyed by user id, so Kafka's default partitioner sends each user to the
partition that owns it (see :mod:`pipeline.stream.ingest.roster`). Bulk steps are sent as columnar batch
messages ``{"columns": {"user": [...], "step": t, "<attribute>": [...]}}`` (the fastest form to
ingest), one or more per owning partition, written to that partition explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import orjson

from pipeline.connections import kafka_security
from pipeline.stream.process.limits import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["ReportProducer", "reports_kafka_producer"]


def reports_kafka_producer(bootstrap: str):
    """The kafka-python producer of reports (single or batch messages): acks=all, ~1 MB batches.

    Not idempotent: after a kill -9 mid-produce the embedded broker (Tansu 0.6) acknowledges the
    retried batch as a duplicate although it never stored it (its sequence bookkeeping precedes the
    write). Plain retries may duplicate a report instead, which the workers count once."""
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        linger_ms=5,
        batch_size=1 << 20,
        max_request_size=MAX_MESSAGE_BYTES,
        acks="all",
        enable_idempotence=False,
    )


class ReportProducer:
    def __init__(
        self,
        bootstrap: str,
        deployment: Deployment,
        roster,
        topic_names: dict[str, str],
        batch_size: int = 5000,
    ):
        self.deployment = deployment
        self.roster = roster
        self.names = topic_names
        self.batch_size = int(batch_size)
        self.partitions = deployment.topics.partitions
        self._owners = roster.owners(self.partitions)
        self._producer = reports_kafka_producer(bootstrap)

    def _labels(self, attribute: str, codes: np.ndarray) -> list:
        return self.deployment.attributes[attribute].wire_values(codes)

    def send_step(
        self,
        step: int,
        values: dict[str, np.ndarray],
        present: np.ndarray | None = None,
        receipt=None,
    ) -> int:
        """Send one step's reports for every roster row (or the rows where ``present``); returns the count.

        ``values[attribute]`` holds one code per roster row (categorical: index into the declared values).
        With a ``receipt`` (:class:`pipeline.fates.Receipt`) every message's acknowledgement is awaited and
        its position recorded (an unacknowledged message raises).
        """
        futures = []
        n = self.roster.n
        rows = np.arange(n) if present is None else np.flatnonzero(present)
        ids = self.roster.ids
        owners = self._owners[rows]
        sent = 0
        for p in range(self.partitions):
            sel = rows[owners == p]
            for start in range(
                0, sel.size, self.batch_size
            ):  # labels a batch at a time: memory stays bounded
                chunk = sel[start : start + self.batch_size]
                columns = {"user": [ids[i] for i in chunk.tolist()], "step": int(step)}
                for a, v in values.items():
                    columns[a] = self._labels(a, np.asarray(v)[chunk])
                future = self._producer.send(
                    self.names["reports"], value=orjson.dumps({"columns": columns}), partition=p
                )
                futures.append((future, chunk.size))
                sent += chunk.size
        self._producer.flush()
        if receipt is not None:
            for future, size in futures:
                stored = future.get(timeout=60)
                receipt.add(stored.partition, stored.offset, size)
        return sent

    def send_raw(
        self, value: bytes, key: bytes | None = None, partition: int | None = None
    ) -> None:
        self._producer.send(self.names["reports"], value=value, key=key, partition=partition)

    def close_step(self, step: int, first: int | None = None, signer=None) -> int:
        """Send the close command of steps ``first``..``step`` (default: ``step`` alone), signed by
        the
        curator (``signer``, default: the deployment's curator key, :func:`curator_signer`);
        returns its
        public close time (ms), which is also its record timestamp."""
        import time

        from pipeline.stream.control.signatures import CloseCommand, curator_signer

        signer = signer or curator_signer(self.deployment, self.roster.ids)
        closed_at = int(time.time() * 1000)
        steps = range(step if first is None else first, step + 1)
        command = CloseCommand.signed(signer, steps, closed_at)
        future = self._producer.send(
            self.names["control"], value=command.value(), timestamp_ms=closed_at
        )
        self._producer.flush()
        future.get(timeout=30)
        return closed_at

    def close(self, timeout: float | None = None) -> None:
        self._producer.close(timeout=timeout)
