"""An upload's messages on their way: sent as they are built, held by the workers until committed.

Every message carries ``dpstream-upload: <id>`` (:mod:`pipeline.stream.ingest.uploads`; and
``dpstream-replace: 1`` for corrections), goes to the partition owning its users and is counted
per partition. :meth:`StagedSend.finish` waits until every message is acknowledged, then sends to
each partition sent to one **commit** record stating how many messages it got, and waits for
those: the workers apply the partition's held messages at its commit. A message not acknowledged,
an error or Ctrl-C before that sends **abort** records instead (:meth:`StagedSend.abort`, best
effort, bounded): the workers drop what they hold, and nothing of the file is accepted. An end
record that is not acknowledged leaves its partition's messages held until the second close
marker after them, then dead-lettered ``uncommitted``: never taken in part.

The receipt (:class:`pipeline.fates.Receipt`) holds each acknowledged message and each commit
record (0 reports): the workers' verdict is waited for up to the commit, where they apply them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pipeline.fates import Receipt
from pipeline.producer import SendResult
from pipeline.stream.ingest.corrections import REPLACE_HEADER
from pipeline.stream.ingest.uploads import end_record, upload_headers
from pipeline.upload_messages import Batch

__all__ = [
    "ABORT_SECONDS",
    "StagedSend",
    "UploadAborted",
    "UploadResult",
    "close_producer",
    "deferred_interrupt",
]

ABORT_SECONDS = 10.0  # what an abort waits at most, for the messages in flight and for its records


@dataclass
class UploadResult(SendResult):
    """What the broker acknowledged of an upload, and how it ended."""

    upload: str = ""  # the upload's id
    committed: bool = False  # every message acknowledged and every commit record too
    counts: dict[int, int] = field(default_factory=dict)  # step -> reports sent
    # partitions whose end record was not acknowledged: their messages stay held by the workers
    # until the second close marker, then are dead-lettered ``uncommitted``
    unended: list[int] = field(default_factory=list)


class UploadAborted(Exception):
    """The upload stopped after some of its messages were handed to the producer, and abort
    records were sent (``result.unended``: the partitions whose abort was not acknowledged).
    ``cause``: why it stopped (a refused report, a refused step, an error, KeyboardInterrupt)."""

    def __init__(self, cause: BaseException, result: UploadResult):
        super().__init__(str(cause))
        self.cause, self.result = cause, result


@dataclass
class _Sent:
    """A message handed to the producer: its future, reports and first report's position."""

    future: object
    reports: int
    first: int


class StagedSend:
    """The messages of one upload, handed to ``producer`` (a kafka-python producer) as built."""

    def __init__(
        self,
        producer,
        topic: str,
        replace: bool = False,
        progress: Callable[[int, int], None] | None = None,
        upload_id: str | None = None,
    ):
        self.producer, self.topic, self.progress = producer, topic, progress
        self.id = upload_id or uuid.uuid4().hex
        self.extra = [(REPLACE_HEADER, b"1")] if replace else []  # beside the upload's headers
        self.messages: dict[int, int] = {}  # partition -> messages handed to the producer
        self.pending: deque[_Sent] = deque()
        self.result = UploadResult(receipt=Receipt(topic), upload=self.id)
        self.total = 0  # reports to send when known (progress), else 0

    @property
    def started(self) -> bool:
        """Whether any message was handed to the producer (an end record is then owed)."""
        return bool(self.messages)

    def send(self, batch: Batch) -> None:
        seq = self.messages.get(batch.partition, 0)  # its number on the partition (a retry's copy)
        headers = upload_headers(self.id, seq) + self.extra
        future = self.producer.send(
            self.topic, value=batch.value, partition=batch.partition, headers=headers
        )
        self.messages[batch.partition] = seq + 1
        self.pending.append(_Sent(future, batch.index.size, int(batch.index[0])))
        while self.pending and self.pending[0].future.is_done:  # type: ignore[attr-defined]
            self._settle(self.pending.popleft(), 0.1)

    def _settle(self, sent: _Sent, wait: float, within: float | None = None) -> None:
        """Count ``sent`` as acknowledged or failed, waiting ``wait`` s for it (``within``: the
        whole wait, which a failure to answer in time is said with)."""
        from kafka.errors import KafkaTimeoutError

        result = self.result
        try:
            stored = sent.future.get(timeout=wait)  # type: ignore[attr-defined]
            result.acknowledged += sent.reports
            assert result.receipt is not None
            result.receipt.add(stored.partition, stored.offset, sent.reports)
        except KafkaTimeoutError:
            said = f" within {within:g} s" if within is not None else ""
            result.failed.append((sent.first, f"not acknowledged by the broker{said}"))
        except Exception as err:  # noqa: BLE001 - a failed message: named by its first report
            result.failed.append((sent.first, f"{type(err).__name__}: {err}"))
        result.sent += sent.reports
        if self.progress is not None:
            self.progress(result.sent, self.total)

    def settle(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until every message handed over is acknowledged or failed."""
        if not self.pending:  # each acknowledged or failed (a record left unsent keeps its place)
            return
        start = time.monotonic()
        try:
            self.producer.flush(timeout=timeout)
        except Exception:  # noqa: BLE001 - each message not acknowledged is counted below
            pass
        while self.pending:  # past the timeout: only those done count as acknowledged
            left = max(0.0, timeout - (time.monotonic() - start))
            self._settle(self.pending.popleft(), left, within=timeout)

    def finish(self, timeout: float = 60.0, started: float | None = None) -> UploadResult:
        """Wait for every message's acknowledgement, then commit (every one acknowledged) or
        abort (one was not: nothing of the upload is taken). ``started``: when the upload began
        (``result.seconds`` counts from it)."""
        self.settle(timeout)
        result = self.result
        if result.failed:
            self.abort()
        else:
            self._end(commit=True, timeout=timeout)
            result.committed = not result.unended
        if started is not None:
            result.seconds = time.monotonic() - started
        return result

    def abort(self, timeout: float | None = None) -> UploadResult:
        """Abort records to every partition sent to, once the messages in flight are sent or
        ``timeout`` passed (default ``ABORT_SECONDS``; best effort: an abort not acknowledged is
        in ``result.unended``)."""
        timeout = ABORT_SECONDS if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.settle(timeout / 2)
        self._end(commit=False, timeout=max(0.1, deadline - time.monotonic()))
        return self.result

    def _end(self, commit: bool, timeout: float) -> None:
        """One end record per partition sent to, n = the messages sent there; its ack awaited
        (a commit's offset goes in the receipt: the workers apply the upload there)."""
        start = time.monotonic()
        ends = []
        for partition, n in sorted(self.messages.items()):
            value, headers = end_record(self.id, n, commit)
            try:
                future = self.producer.send(
                    self.topic, value=value, partition=partition, headers=headers
                )
            except Exception:  # noqa: BLE001 - not sent: the partition's messages stay held
                self.result.unended.append(partition)
                continue
            ends.append((partition, future))
        try:
            self.producer.flush(timeout=timeout)
        except Exception:  # noqa: BLE001 - each end record not acknowledged is named below
            pass
        for partition, future in ends:
            try:
                stored = future.get(timeout=max(0.0, timeout - (time.monotonic() - start)))
            except Exception:  # noqa: BLE001 - its partition's messages stay held
                self.result.unended.append(partition)
                continue
            if commit:
                assert self.result.receipt is not None
                self.result.receipt.add_commit(stored.partition, stored.offset)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Ctrl-C (SIGINT) held back until the block ends, then raised: the commit records of an
    upload are sent to every partition or to none (an interrupt between two would commit a
    part of the file). The block waits for a few records' acknowledgements. Only in the main
    thread, where Python delivers signals; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)  # the usual handler: KeyboardInterrupt


def close_producer(producer, timeout: float | None = None) -> None:
    """Close a kafka-python producer, waiting at most ``timeout`` seconds for what it still has
    to send (None: all of it). Its ``close`` raises when that wait times out, before it stops
    its sender thread: the sender is then stopped without sending the rest, and the producer
    closed."""
    try:
        producer.close(timeout=timeout)
        return
    except Exception:  # noqa: BLE001 - KafkaTimeoutError from its flush: stopped below
        pass
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()  # the pending records fail, their futures are woken
        sender.join(timeout or 1.0)
    try:
        producer.close(timeout=0)
    except Exception:  # noqa: BLE001 - nothing left to wait for: the sender has stopped
        pass
