"""A small producer for the people who send reports (docs/topics.md, "Sending reports").

::

    from pipeline.config import load_config
    from pipeline.producer import ReportSender

    deployment = load_config("config/sipp-poverty.yaml")
    with ReportSender(deployment, "127.0.0.1:9092") as sender:
        sender.check_topic()                       # the reports topic exists (no silent auto-creation)
        sender.validate(reports)                   # the workers' own parser: ReportRejected if they would reject one
        result = sender.send(reports)              # keyed by user id, acks=all
        print(result.acknowledged, result.failed)  # what the broker acknowledged; (index, error) of the rest
        # result.receipt: where they were stored, for pipeline.fates.await_fates (accepted or dead-lettered)

A report is ``{"user": "<roster id>", "step": t, "values": {"<attribute>": value, ...}}`` (the
JSON Schema ``pipeline/schemas/reports.value.json``). Each is sent keyed by its user id, so the
default partitioner puts a user's reports on the partition that owns it. ``send`` waits for every
acknowledgement and says which reports were not acknowledged; nothing fails silently.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.connections import kafka_security
from pipeline.fates import Receipt

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = [
    "ReportSender",
    "ReportRejected",
    "TopicMissing",
    "SendResult",
    "progress_printer",
    "require_topic",
    "topic_missing",
    "SEND_WINDOW",
]

SEND_WINDOW = 10_000  # reports per window: send() has at most two windows of futures in flight


class ReportRejected(ValueError):
    """A report the workers would dead-letter; ``index`` is its position in what was given."""

    def __init__(self, index: int, reason: str, detail: str):
        self.index, self.reason, self.detail = index, reason, detail
        super().__init__(f"report {index}: {reason}: {detail}")


class TopicMissing(RuntimeError):
    """The deployment's reports topic does not exist on the broker (a typo, or the deployment is not up)."""


def require_topic(bootstrap: str, topic: str, deployment_name: str | None = None) -> None:
    """:class:`TopicMissing` unless ``topic`` exists on the broker. The broker's topics are listed (a
    metadata request for all topics, which creates none) before any client names the topic: a
    metadata request naming a missing topic makes the embedded broker (Tansu) create it, whatever
    the request's ``allow_auto_topic_creation`` says, and a producer sends one before its first
    send; the reports would go to a new topic no worker reads (docs/topics.md, "topics are
    created on first use"; tests/test_upload_producer.py)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, **kafka_security(), client_id="dpstream-produce"
    )
    try:
        topics = set(admin.list_topics())
    finally:
        admin.close()
    if topic not in topics:
        raise topic_missing(bootstrap, topic, deployment_name)


def topic_missing(bootstrap: str, topic: str, deployment_name: str | None = None) -> TopicMissing:
    whose = f"the deployment {deployment_name!r}" if deployment_name else "its deployment"
    return TopicMissing(
        f"topic {topic!r} does not exist on {bootstrap}: is {whose} up (its topics are "
        "created at start), and is the name right? nothing sent"
    )


@dataclass
class SendResult:
    sent: int = 0
    acknowledged: int = 0
    failed: list[tuple[int, str]] = field(
        default_factory=list
    )  # (index, error) of reports not acknowledged
    seconds: float = 0.0
    receipt: Receipt | None = None  # where the broker stored the acknowledged ones (pipeline.fates)


def progress_printer(
    label: str, unit: str = "", every: float = 2.0, stream=None
) -> Callable[[int, int], None]:
    """A callback ``(done, total)`` printing one progress line at most every ``every`` seconds (stderr),
    once the operation has taken longer than that; ``total`` 0: not known, only ``done`` is shown."""
    stream = stream or sys.stderr
    start, last = time.monotonic(), [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= every or done == total:
            if now - start >= every:  # quick operations print nothing
                of = f" of {total:,}" if total else ""
                print(f"{label}: {done:,}{of}{unit}", file=stream, flush=True)
            last[0] = now

    return show


class ReportSender:
    """Validates with the workers' own parser, sends keyed by user id, reports what was acknowledged."""

    def __init__(
        self, deployment: Deployment, bootstrap: str, roster=None, topic: str | None = None
    ):
        from pipeline.stream.ingest.roster import Roster
        from pipeline.stream.kafka.topics import topic_names

        self.deployment = deployment
        self.bootstrap = bootstrap
        self.roster = roster or Roster.from_config(deployment.roster)
        self.topic = topic or topic_names(deployment)["reports"]
        self._producer: Any = None  # a kafka.KafkaProducer, made on the first send

    def __enter__(self) -> ReportSender:
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(
            timeout=0 if kind is KeyboardInterrupt else None
        )  # an interrupt waits for nothing more

    def check_topic(self) -> None:
        """TopicMissing unless the reports topic exists (:func:`require_topic`)."""
        require_topic(self.bootstrap, self.topic, self.deployment.name)

    def validate(self, reports: list[dict]) -> None:
        """ReportRejected for the first report the workers' parser would reject (stateless checks: format,
        user, step, values); repeated (user, step) pairs are checked too."""
        from pipeline.stream.ingest.report_files import first_rejection

        first = first_rejection(reports, self.deployment, self.roster)
        if first is not None:
            raise ReportRejected(*first[:3])

    def send(
        self,
        reports: Iterable[dict],
        progress: Callable[[int, int], None] | None = None,
        timeout: float = 60.0,
        total: int | None = None,
        window: int = SEND_WINDOW,
    ) -> SendResult:
        """Send every report keyed by its user id and wait for the acknowledgements (acks=all).

        ``reports`` may be any iterable (a generator reading a file): they are sent ``window`` at a time,
        and a window's acknowledgements are collected while the next one is on its way, so at most two
        windows are in flight and memory is bounded however many reports are sent (flushing each window
        before reading the next halved the rate). ``timeout`` applies per window; ``total``
        is the count shown by ``progress`` (default: ``len(reports)`` when it has one, else unknown)."""
        from kafka import KafkaProducer

        if total is None and isinstance(reports, Sized):
            total = len(reports)
        if self._producer is None:
            # not idempotent, as pipeline.stream.kafka.report_producer: the embedded broker acknowledges a batch retried
            # after a kill -9 as a duplicate it never stored (docs/streaming.md, "What is durable where")
            self._producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                **kafka_security(),
                linger_ms=5,
                batch_size=1 << 20,
                acks="all",
                enable_idempotence=False,
            )
        start = time.monotonic()
        result = SendResult(receipt=Receipt(self.topic))
        it = iter(reports)
        waiting: list = []  # the previous window's futures: collected while this window is on its way
        while True:
            batch = list(islice(it, window))
            futures = [
                self._producer.send(
                    self.topic, key=str(rep["user"]).encode(), value=orjson.dumps(rep)
                )
                for rep in batch
            ]
            del batch
            if not futures:
                self._producer.flush(timeout=timeout)
            self._collect(waiting, result, timeout, progress, total)
            if not futures:
                break
            waiting = futures
        result.seconds = time.monotonic() - start
        return result

    def _collect(
        self, futures: list, result: SendResult, timeout: float, progress, total: int | None
    ) -> None:
        """Wait for a window's acknowledgements (at most ``timeout`` for the window), counting each."""
        start = time.monotonic()
        for future in futures:
            try:
                stored = future.get(timeout=max(0.1, timeout - (time.monotonic() - start)))
                if result.receipt is not None:
                    result.receipt.add(stored.partition, stored.offset)
                result.acknowledged += 1
            except Exception as err:  # noqa: BLE001 - each failure is reported with its report's index
                result.failed.append((result.sent, f"{type(err).__name__}: {err}"))
            result.sent += 1
            if progress is not None:
                progress(result.sent, total if total is not None else 0)

    def close(self, timeout: float | None = None) -> None:
        """``timeout``: seconds to wait for what is still in flight (None: all of it; 0 after an interrupt)."""
        if self._producer is not None:
            self._producer.close(timeout=timeout)
            self._producer = None
