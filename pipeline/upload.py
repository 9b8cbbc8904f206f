"""Fast uploads of report files (CSV, JSONL, Parquet) as columnar batch messages, streamed.

What ``dpstream produce`` sends a file with, a chunk of reports at a time
(:mod:`pipeline.upload_columns`: pyarrow reads Parquet by record batches, CSV and JSONL by blocks;
the next chunk is read ahead in a thread, :mod:`pipeline.read_ahead`):

1. **Check** (:func:`read_upload`): every chunk is checked vectorised (:mod:`pipeline.upload_check`:
   the workers' parser's rules on whole columns, enrolled users, and no (user, step) twice in the
   file, with a bitmap per step). The first report the workers would reject stops the upload with
   nothing sent: the error comes from the per-report checker
   (:func:`pipeline.stream.ingest.report_files.check_report_file`: file, line and column) for CSV
   and JSONL; a Parquet file is named by row. The pass keeps, per step, the reports counted, the
   first report's position and the bitmap of the users reported (what ``produce`` compares with
   the steps the workers accept now, and ``--dry-run`` with what they hold); and each checked
   chunk's batch messages for the partitions that own its users (:mod:`pipeline.upload_messages`,
   built after each chunk's check, in a thread beside it given a third core) while they fit in
   ``DPSTREAM_UPLOAD_KEEP_MB``.
2. **Send** (:func:`send_upload`): the kept messages are handed to the producer: what is sent is
   what was checked. When they did not all fit, the file is read again: the first chunks' kept
   messages are sent as they are and each later chunk's are built and handed to the producer, whose sender thread ships them while the next chunk is read
   and built; a file that changed since its check then stops the send (what was acknowledged
   before stays on the log and the workers judge it). The producer's buffer (32 MB) bounds what
   waits to be sent.

Why the check comes first and not chunk by chunk with the send: a bad report in the last chunk
would otherwise come after the first chunks were sent, and a file would be half taken
(docs/own-data.md, "All or nothing"). Memory: up to three chunks, the bitmaps and at most
``DPSTREAM_UPLOAD_KEEP_MB`` of messages, whatever the file's length. The benchmark
(``jobs/bench/bench_upload.py``) times both passes.

A JSONL file pyarrow cannot read as one table (a value that is a number on one line and a string on
another, an explicit ``null``) is read by the per-report reader instead: slower, same messages.

``replace``: every message carries the header ``dpstream-replace: 1`` — a correction: each report
replaces the one the workers hold for its (user, step) while that step is open (docs/streaming.md,
"Correcting an open step").
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.allocator import keep_freed_memory
from pipeline.config import Deployment
from pipeline.fates import Receipt
from pipeline.producer import SendResult
from pipeline.read_ahead import read_ahead
from pipeline.small_ints import value_counts
from pipeline.stream.ingest.corrections import REPLACE_HEADER
from pipeline.stream.ingest.report_files import (
    ReportFileError,
    _stamp,
    check_report_file,
)
from pipeline.upload_check import FileCheck, Problem, stateless_problem
from pipeline.upload_columns import Columns, NotTabular, arrow_chunks, report_chunks
from pipeline.upload_messages import Batch, chunk_messages, message_order
from pipeline.upload_rows import UserRows

__all__ = [
    "UPLOAD_SUFFIXES",
    "EarlyProducer",
    "Upload",
    "UploadStopped",
    "batch_producer",
    "read_upload",
    "send_upload",
    "upload_file",
]

# MB of checked messages kept for the send (~18 bytes a report of short ids, message and position:
# ~3.5 * 10^6 reports)
KEEP_MB = 64

UPLOAD_SUFFIXES = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class UploadStopped(Exception):
    """The send stopped part way (the file changed since its check); ``result``: what the broker
    acknowledged before."""

    def __init__(self, error: ReportFileError, result: SendResult):
        super().__init__(str(error))
        self.result = result


@dataclass(frozen=True)
class Upload:
    """A checked file: per step the reports to send and the first one's position. Its messages
    are built from the file again when sent (:meth:`messages`)."""

    path: Path
    kind: str
    deployment: Deployment
    tabular: bool  # read by pyarrow (else by the per-report reader)
    reports_in_file: int
    counts: dict[int, int]  # step -> reports to send
    first_rows: dict[int, int]  # step -> position in the file of its first report
    file_counts: dict[int, int]  # step -> reports in the file (what the check counted)
    stamp: tuple[int, int]  # the file's size and modification time when checked
    roster_of: Callable[[], Any] = field(compare=False, repr=False)  # makes the Roster
    step: int | None = None  # only this step's reports are sent
    # the messages the check built, per chunk, for the chunks whose messages fit in
    # ``keep_bytes()`` (the first ones); ``kept_whole``: every chunk's, the file is not read again
    kept: tuple[tuple[Batch, ...], ...] = field(default=(), compare=False, repr=False)
    kept_whole: bool = False
    # step -> the roster rows with a report in the file (the check's bitmaps)
    present: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return sum(self.counts.values())

    def steps(self) -> set[int]:
        return set(self.counts)

    def only_step(self, step: int) -> Upload:
        return dc_replace(
            self,
            counts={step: self.counts[step]} if step in self.counts else {},
            first_rows={step: self.first_rows[step]} if step in self.first_rows else {},
            step=step,
            present={step: self.present[step]} if step in self.present else {},
        )

    @property
    def first_lines(self) -> dict[int, int]:
        """step -> line of its first report (Parquet: row number, 1-based)."""
        return {t: self.line_of_row(i) for t, i in self.first_rows.items()}

    def line_of_row(self, position: int) -> int:
        """Line of the report at ``position`` (0-based) in the file (Parquet: its row, 1-based)."""
        return _line_of(self, position)

    @cached_property
    def one_line_per_report(self) -> bool:
        """The file (CSV, JSONL) has one line per report (and the CSV header): no blank lines and
        no quoted line breaks, so a report's line is arithmetic."""
        return _lines_in(self.path) == self.reports_in_file + (1 if self.kind == "csv" else 0)

    def chunks(self) -> Iterator[Columns]:
        if self.tabular:
            return arrow_chunks(self.path, self.kind, self.deployment)
        return report_chunks(self.path, self.deployment)

    def messages(self) -> Iterator[Batch]:
        """The batch messages: those the check built and kept; for a file whose messages did not
        all fit, the rest built from the file read again a chunk at a time (:class:`ReportFileError`
        as soon as the file is seen to differ from the one checked)."""
        if self.kept_whole:
            for batches in self.kept:
                yield from self._of_step(batches)
            return
        deployment = self.deployment
        if _stamp(self.path) != self.stamp:
            raise self._changed("its size or modification time")
        counts: dict[int, int] = {}
        try:
            for number, chunk in enumerate(self.chunks()):
                if stateless_problem(chunk, deployment.horizon) is not None:
                    raise self._changed("a report the check had passed is now rejected")
                values, _, n = value_counts(chunk.steps)
                for t, c in zip(values.tolist(), n.tolist()):
                    counts[t] = counts.get(t, 0) + c
                if number < len(self.kept):  # built by the check: not again
                    yield from self._of_step(self.kept[number])
                    continue
                if self.step is None:
                    keep = np.arange(len(chunk))
                else:
                    keep = np.flatnonzero(chunk.steps == self.step)
                yield from chunk_messages(chunk, keep, deployment)
        except NotTabular:
            raise self._changed("pyarrow no longer reads it as a table") from None
        if counts != self.file_counts or _stamp(self.path) != self.stamp:
            raise self._changed("its reports per step")

    def _of_step(self, batches: tuple[Batch, ...]) -> Iterator[Batch]:
        return (b for b in batches if self.step is None or b.step == self.step)

    def _changed(self, what: str) -> ReportFileError:
        return ReportFileError(
            self.path,
            None,
            None,
            f"the file changed after it was checked ({what}); nothing more sent",
        )

    @property
    def batches(self) -> tuple[Batch, ...]:
        """Every message at once (in memory: for tests and the benchmark's raw baseline)."""
        return tuple(self.messages())

    def line_of(self, index: int) -> int | None:
        """Line of the ``index``-th report sent (:func:`send_upload` sends them message by
        message; reads the file again)."""
        for batch in self.messages():
            if index < batch.index.size:
                return self.line_of_row(int(batch.index[index]))
            index -= batch.index.size
        return None


# -- checking -----------------------------------------------------------------------------
def read_upload(path: str | Path, deployment, roster=None) -> Upload:
    """Check a whole report file a chunk at a time (kept: per-step counts, the check's bitmaps and,
    while they fit, the messages); :class:`ReportFileError` (nothing to send) if any report would be rejected
    by the workers' stateless checks or repeats a (user, step) of the file. ``roster``: the
    deployment's (made from its configuration when needed: a roster file, or an error to name)."""
    path = Path(path)
    kind = UPLOAD_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ReportFileError(
            path,
            None,
            None,
            f"unknown file type {path.suffix!r}: report files end in "
            + ", ".join(sorted(UPLOAD_SUFFIXES)),
        )
    if not path.exists():
        raise ReportFileError(path, None, None, "no such file")
    keep_freed_memory()  # chunk after chunk of numpy temporaries: not faulted in again each time
    roster_of = _roster_maker(deployment, roster)
    stamp = _stamp(path)
    upload = Upload(path, kind, deployment, True, 0, {}, {}, {}, stamp, roster_of)
    try:
        check, kept, whole = _check(upload)
    except NotTabular:  # the per-report checker reads it (and raises, naming the line)
        check_report_file(path, deployment, roster_of())
        upload = dc_replace(upload, tabular=False)
        check, kept, whole = _check(upload)
    return dc_replace(
        upload,
        reports_in_file=check.reports,
        counts=dict(check.counts),
        first_rows=dict(check.first_rows),
        file_counts=dict(check.counts),
        kept=kept,
        kept_whole=whole,
        present=check.present,
    )


def _roster_maker(deployment, roster) -> Callable[[], object]:
    made: list = [roster]

    def roster_of():
        if made[0] is None:
            from pipeline.stream.ingest.roster import Roster

            made[0] = Roster.from_config(deployment.roster)
        return made[0]

    return roster_of


def _check(upload: Upload) -> tuple[FileCheck, tuple[tuple[Batch, ...], ...], bool]:
    """The file's check, the messages of its first chunks (built as each chunk passes) while they
    fit in ``keep_bytes()``, and whether those are all of them."""
    deployment = upload.deployment
    check = FileCheck(
        deployment.horizon, deployment.n, UserRows(deployment.roster, upload.roster_of)
    )
    kept = _Kept(keep_bytes(), deployment)
    with kept:
        for chunk in read_ahead(upload.chunks()):
            problem = check.problem(chunk)
            if problem is not None:
                _refuse(upload, problem, chunk)
            kept.build(chunk)
        return check, *kept.batches()


class _Kept:
    """The messages of the checked chunks, those of the first chunks only, while they fit in
    ``room`` bytes. Built in the check's thread after each chunk's check, or, given a third
    core, in a thread beside the check (numpy and Arrow release the GIL: the build of a chunk
    overlaps the check of the next), at most two chunks behind it. On two cores the read-ahead
    thread and the check's are one a core: a third thread only shares them (the check pass of
    10^6 reports ~5% longer with it, and ~5% more CPU)."""

    BEHIND = 2

    def __init__(self, room: int, deployment: Deployment, threaded: bool | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.room, self.deployment = room, deployment
        self.kept: list[tuple[Batch, ...]] = []
        self.full = room <= 0  # nothing more is kept
        self.pending: deque = deque()
        if threaded is None:
            threaded = _cores() >= 3
        self.pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload-build")
            if threaded
            else None
        )

    def __enter__(self) -> _Kept:
        return self

    def __exit__(self, *exc) -> None:
        for future in self.pending:
            future.cancel()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def build(self, chunk: Columns) -> None:
        if self.full:
            return
        if self.pool is None:
            self._keep(_chunk_batches(chunk, self.deployment))
            return
        while len(self.pending) >= self.BEHIND:
            self._collect()
        # the owners and message order made here, beside the check: the build is the longer
        message_order(chunk, self.deployment.topics.partitions)
        self.pending.append(self.pool.submit(_chunk_batches, chunk, self.deployment))

    def _collect(self) -> None:
        self._keep(self.pending.popleft().result())

    def _keep(self, batches: tuple[Batch, ...]) -> None:
        if self.full:
            return
        self.room -= sum(len(b.value) + b.index.nbytes for b in batches)
        if self.room < 0:  # no more room: the send builds this chunk and the rest again
            self.full = True
            for future in self.pending:
                future.cancel()
            self.pending.clear()
        else:
            self.kept.append(batches)

    def batches(self) -> tuple[tuple[tuple[Batch, ...], ...], bool]:
        """The kept messages per chunk, and whether they are every chunk's."""
        while self.pending and not self.full:
            self._collect()
        return tuple(self.kept), not self.full


def _cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _chunk_batches(chunk: Columns, deployment: Deployment) -> tuple[Batch, ...]:
    """The chunk's messages (positions held as int32 when they fit: 4 bytes a report kept)."""
    return tuple(chunk_messages(chunk, np.arange(len(chunk)), deployment))


def keep_bytes() -> int:
    """Bytes of checked messages the upload keeps for its send (``KEEP_MB``, or the environment's
    ``DPSTREAM_UPLOAD_KEEP_MB``; 0: none, the send reads the file again)."""
    text = os.environ.get("DPSTREAM_UPLOAD_KEEP_MB", "").strip()
    if not text:
        return KEEP_MB << 20
    if not text.isdigit():
        raise ValueError(f"DPSTREAM_UPLOAD_KEEP_MB must be a whole number of MB, got {text!r}")
    return int(text) << 20


_PROBLEMS = {
    "step": "step outside 1..{horizon}",
    "out_of_domain": "value {value!r} of {attribute!r} is outside its domain",
    "empty": "no attribute reported",
    "duplicate": "a second report for user {user!r} at step {step}",
    "unknown_user": "unknown_user: user {user!r} is not enrolled",
}


def _refuse(upload: Upload, problem: Problem, chunk: Columns):
    """Raise the per-report checker's error (CSV, JSONL: line and column), else name the row."""
    deployment = upload.deployment
    if upload.kind != "parquet":
        check_report_file(
            upload.path, deployment, upload.roster_of()
        )  # raises, naming line and column
    at = problem.position
    user = chunk.users[at - chunk.start].as_py()
    detail = _PROBLEMS[problem.reason].format(
        horizon=deployment.horizon,
        attribute=problem.attribute,
        value=chunk.cell(at, problem.attribute),
        user=user,
        step=int(chunk.steps[at - chunk.start]),
    )
    raise ReportFileError(
        upload.path,
        None,
        None,
        f"row {at + 1}: {detail}; the workers would dead-letter it; nothing sent",
    )


# -- lines --------------------------------------------------------------------------------
def _line_of(upload: Upload, position: int) -> int:
    """Line of the report at ``position`` (0-based) in the file (Parquet: its row, 1-based).
    When the file has exactly one line per report (plus the CSV header) that is arithmetic;
    otherwise (blank lines, quoted line breaks) the per-report reader counts."""
    if upload.kind == "parquet":
        return position + 1
    if upload.one_line_per_report:
        return position + 1 + (1 if upload.kind == "csv" else 0)
    from itertools import islice

    from pipeline.stream.ingest.report_files import _records

    return next(islice(_records(upload.path, upload.deployment), position, None))[0]


def _lines_in(path: Path, block: int = 1 << 20) -> int:
    """Lines of a text file (a last line without a line break counts), read a block at a time."""
    lines, last = 0, b"\n"
    with path.open("rb") as fh:
        while data := fh.read(block):
            lines += data.count(b"\n")
            last = data[-1:]
    return lines + (0 if last == b"\n" else 1)


# -- sending ------------------------------------------------------------------------------
def batch_producer(bootstrap: str):
    """The producer of the upload's batch messages (and of its benchmark's raw baseline): the
    report producer's settings (:func:`pipeline.stream.kafka.report_producer.reports_kafka_producer`;
    docs/streaming.md, "What is durable where")."""
    from pipeline.stream.kafka.report_producer import reports_kafka_producer

    return reports_kafka_producer(bootstrap)


class EarlyProducer:
    """The upload's producer made in a thread while the file is checked: the topic's check, the
    client's creation (connection, the broker's versions) and the topic's metadata take tens of
    milliseconds of waiting on the broker, which then overlap the check instead of delaying the
    first send. Nothing is sent before :func:`send_upload` is given it.

    The topic is checked before any request names it, by the topics the broker lists
    (:func:`_topics_listed_by`, which creates none; else
    :func:`pipeline.producer.require_topic`), since the embedded broker creates a topic that a
    request names and it does not have. A missing topic is
    :class:`pipeline.producer.TopicMissing`, raised by :meth:`get`, and the producer is closed.

    A daemon thread: a process that stops early (a refused file, Ctrl-C) neither waits for a
    broker that does not answer nor leaves a producer open (:meth:`close` closes it when made)."""

    def __init__(self, bootstrap: str, topic: str, deployment_name: str | None = None):
        self.bootstrap = bootstrap
        self._lock = threading.Lock()
        self._made = threading.Event()
        self._producer: Any = None
        self._error: BaseException | None = None
        self._closed = False  # closed before it was made: the thread closes it
        self._taken = False  # handed to the send, which closes it
        threading.Thread(
            target=self._make,
            args=(bootstrap, topic, deployment_name),
            name="upload-producer",
            daemon=True,
        ).start()

    def _make(self, bootstrap: str, topic: str, deployment_name: str | None) -> None:
        from pipeline.producer import require_topic, topic_missing

        producer = None
        try:
            producer = batch_producer(bootstrap)  # names no topic
            listed = _topics_listed_by(producer, topic)
            if listed is None:  # a kafka-python without those internals: a client of its own
                require_topic(bootstrap, topic, deployment_name)
            elif topic not in listed:
                raise topic_missing(bootstrap, topic, deployment_name)
            try:
                producer.partitions_for(topic)  # the metadata the first send would wait for
            except Exception:  # noqa: BLE001 - the send then fetches it and reports what fails
                pass
        except BaseException as err:  # noqa: BLE001 - raised by get()
            self._error = err
            if producer is not None:
                producer.close()
                producer = None
        with self._lock:
            self._producer = producer
            self._made.set()
            late = self._closed
        if late and producer is not None:
            producer.close()

    def wait(self) -> None:
        """Until the producer is made; :class:`pipeline.producer.TopicMissing` or an error making
        it is raised here."""
        self._made.wait()
        if self._error is not None:
            raise self._error

    def get(self):
        """The producer, once made (:meth:`wait`), handed to the caller, which closes it."""
        self.wait()
        self._taken = True
        return self._producer

    def close(self) -> None:
        """Close the producer unless :meth:`get` handed it out; not made yet: the thread closes
        it when it is (nothing waited for)."""
        with self._lock:
            self._closed = True
            producer = self._producer if self._made.is_set() and not self._taken else None
            self._producer = None if producer is not None else self._producer
        if producer is not None:
            producer.close()

    def __enter__(self) -> EarlyProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _topics_listed_by(producer, topic: str, timeout: float = 30.0) -> set[str] | None:
    """The broker's topics, as the producer's own connection learnt them: from the answer to its
    first metadata request (which names no topic) when that lists ``topic``, else from a metadata
    request for all topics (which creates none); the answer also holds the partitions the first
    send needs. None when this kafka-python's producer has no cluster metadata to ask with. A
    second client for this (``require_topic``'s admin client) costs ~10 ms of the check pass's
    time on two cores: its first use loads its protocol and it runs beside the check."""
    metadata: Any = getattr(producer, "_metadata", None)
    sender: Any = getattr(producer, "_sender", None)
    if not (hasattr(metadata, "need_all_topic_metadata") and hasattr(metadata, "topics")):
        return None
    if not (hasattr(metadata, "request_update") and hasattr(sender, "wakeup")):
        return None
    known = set(metadata.topics())
    if topic in known:
        # the client's first metadata request named no topic (it creates none) and the broker
        # listed the topic: it exists. Asking again would wait out the client's refresh
        # backoff (``retry_backoff_ms``, 100 ms: longer than the check of 10^6 reports)
        return known
    metadata.need_all_topic_metadata = True  # the next requests ask for every topic
    try:
        # a request already in flight may ask for no topic: the second answer is to one for all
        for _ in range(2):
            answered = threading.Event()
            future = metadata.request_update()
            future.add_both(lambda event, *_: event.set(), answered)
            sender.wakeup()
            if not answered.wait(timeout):
                raise TimeoutError(f"the broker's topics were not listed within {timeout:g} s")
            if future.failed():
                raise future.exception
            topics = set(metadata.topics())
            if topics:
                return topics
        return topics
    finally:
        metadata.need_all_topic_metadata = False


@dataclass
class _Sent:
    """A message handed to the producer: its future, reports and first report's position."""

    future: object
    reports: int
    first: int


def send_upload(
    upload: Upload,
    bootstrap: str,
    topic: str,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 60.0,
    early: EarlyProducer | None = None,
) -> SendResult:
    """Send every message to its partition (acks=all) as it is built, and wait for the
    acknowledgements; the result counts reports (a message's reports are acknowledged together)
    and a failure names the position in the file of the message's first report. ``replace``:
    each message carries the correction header. :class:`UploadStopped` if the file changed since
    its check. ``early``: the producer made while the file was checked (closed here; its
    :class:`pipeline.producer.TopicMissing` raised here, nothing sent)."""
    producer = early.get() if early is not None else batch_producer(bootstrap)
    headers = [(REPLACE_HEADER, b"1")] if replace else None
    receipt = Receipt(topic)
    start, result = time.monotonic(), SendResult(receipt=receipt)
    pending: deque[_Sent] = deque()

    def settle(sent: _Sent, wait: float) -> None:
        try:
            stored = sent.future.get(timeout=wait)  # type: ignore[attr-defined]
            result.acknowledged += sent.reports
            receipt.add(stored.partition, stored.offset, sent.reports)
        except Exception as err:  # noqa: BLE001 - a failed message: named by its first report
            result.failed.append((sent.first, f"{type(err).__name__}: {err}"))
        result.sent += sent.reports
        if progress is not None:
            progress(result.sent, len(upload))

    stopped = None
    try:
        try:
            for batch in upload.messages():
                future = producer.send(
                    topic, value=batch.value, partition=batch.partition, headers=headers
                )
                pending.append(_Sent(future, batch.index.size, int(batch.index[0])))
                while pending and pending[0].future.is_done:  # type: ignore[attr-defined]
                    settle(pending.popleft(), 0.1)
        except ReportFileError as err:
            stopped = err
        producer.flush(timeout=timeout)
        while pending:
            settle(pending.popleft(), max(0.1, timeout - (time.monotonic() - start)))
    finally:
        producer.close()
    result.seconds = time.monotonic() - start
    if stopped is not None:
        raise UploadStopped(stopped, result)
    return result


def upload_file(
    path: str | Path,
    deployment,
    bootstrap: str,
    roster=None,
    step: int | None = None,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SendResult:
    """Check and send a report file (``step``: only that step's reports); raises
    :class:`ReportFileError` with nothing sent when a report would be rejected, and
    :class:`pipeline.producer.TopicMissing` (nothing sent, no topic made) when the deployment's
    reports topic does not exist. The producer is made while the file is checked
    (:class:`EarlyProducer`)."""
    from pipeline.stream.kafka.topics import topic_names

    topic = topic_names(deployment)["reports"]
    early = EarlyProducer(bootstrap, topic, deployment.name)
    try:
        upload = read_upload(path, deployment, roster)
    except BaseException:
        early.close()
        raise
    if step is not None:
        upload = upload.only_step(step)
    return send_upload(upload, bootstrap, topic, replace, progress, early=early)
