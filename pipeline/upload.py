"""Fast uploads of report files (CSV, JSONL, Parquet) as columnar batch messages, in one pass.

What ``dpstream produce`` sends a file with, a chunk of reports at a time
(:mod:`pipeline.upload_columns`: pyarrow reads Parquet by record batches, CSV and JSONL by blocks;
the next chunk is read ahead in a thread, :mod:`pipeline.read_ahead`). Each chunk is

1. **checked** (:func:`checked_chunks`), vectorised (:mod:`pipeline.upload_check`: the workers'
   parser's rules on whole columns, enrolled users, and no (user, step) twice in the file, with a
   bitmap per step). A report the workers would reject stops the upload: the error comes from the
   per-report checker (:func:`pipeline.stream.ingest.report_files.check_report_file`: file, line
   and column) for CSV and JSONL; a Parquet file is named by row;
2. **built** into batch messages for the partitions that own its users
   (:mod:`pipeline.upload_messages`) and
3. **handed to the producer** at once (:func:`send_upload`, :class:`pipeline.upload_send.StagedSend`):
   its sender thread ships them while the next chunk is read, checked and built. The producer's
   buffer (32 MB) bounds what waits to be sent.

All or nothing holds although a bad report in the last chunk is found after the first chunks
were sent: every message carries the upload's id, the workers hold them, and apply them only at
the upload's commit records, sent once every message is acknowledged; a stop part way sends abort
records and they drop them (:mod:`pipeline.stream.ingest.uploads`; docs/own-data.md, "All or
nothing"). Memory: up to three chunks and the bitmaps, whatever the file's length. The benchmark
(``jobs/bench/bench_upload.py``) times it against a raw producer sending the same messages.

:func:`read_upload` checks a whole file without sending (``--dry-run``, and ``produce``'s exact
count of duplicates before a send when the workers hold reports of a step of its first chunk).

A JSONL file pyarrow cannot read as one table (a value that is a number on one line and a string on
another, an explicit ``null``) is read by the per-report reader instead: slower, same messages.

``replace``: every message carries the header ``dpstream-replace: 1`` — a correction: each report
replaces the one the workers hold for its (user, step) while that step is open (docs/streaming.md,
"Correcting an open step").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.allocator import keep_freed_memory
from pipeline.config import Deployment
from pipeline.read_ahead import read_ahead
from pipeline.stream.ingest import uploads
from pipeline.stream.ingest.report_files import ReportFileError, check_report_file
from pipeline.upload_check import FileCheck, Problem
from pipeline.upload_columns import Columns, NotTabular, arrow_chunks, report_chunks
from pipeline.upload_messages import Batch, chunk_messages
from pipeline.upload_rows import UserRows
from pipeline.upload_send import (
    StagedSend,
    UploadAborted,
    UploadResult,
    close_producer,
    deferred_interrupt,
)

__all__ = [
    "UPLOAD_SUFFIXES",
    "EarlyProducer",
    "StepRefused",
    "Upload",
    "UploadAborted",
    "UploadResult",
    "batch_producer",
    "checked_chunks",
    "open_upload",
    "read_upload",
    "send_upload",
    "upload_file",
]

UPLOAD_SUFFIXES = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class StepRefused(Exception):
    """A step of the file the workers would not take now (closed, or too far ahead): ``why``,
    and the position in the file of its first report."""

    def __init__(self, step: int, position: int, why: str):
        super().__init__(why)
        self.step, self.position, self.why = step, position, why


@dataclass(frozen=True)
class Upload:
    """A report file: its kind and, once checked (:func:`read_upload`), per step the reports to
    send, the first one's position and the bitmap of the users reported."""

    path: Path
    kind: str
    deployment: Deployment
    roster_of: Callable[[], Any] = field(compare=False, repr=False)  # makes the Roster
    reports_in_file: int = 0
    counts: dict[int, int] = field(default_factory=dict)  # step -> reports to send
    first_rows: dict[int, int] = field(default_factory=dict)  # step -> position of its first
    step: int | None = None  # only this step's reports are sent
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
        """The file (CSV, JSONL), checked whole, has one line per report (and the CSV header): no
        blank lines and no quoted line breaks, so a report's line is arithmetic."""
        return _lines_in(self.path) == self.reports_in_file + (1 if self.kind == "csv" else 0)

    def first_steps(self) -> set[int] | None:
        """The steps of the file's first chunk, read but not checked (None: not known so: pyarrow
        does not read the file as a table, or it fails on it; the check names the problem)."""
        try:
            chunk = next(iter(arrow_chunks(self.path, self.kind, self.deployment)), None)
        except Exception:  # noqa: BLE001 - the check that follows reads it again and says why
            return None
        return set() if chunk is None else set(np.unique(chunk.steps).tolist())

    def check_chunks(self) -> Iterator[Columns]:
        """The file's chunks, each checked (:func:`checked_chunks`)."""
        return checked_chunks(self, _file_check(self))

    def kept(self, chunk: Columns) -> np.ndarray:
        """Offsets in ``chunk`` of the reports to send (``step``: that step's only)."""
        if self.step is None:
            return np.arange(len(chunk))
        return np.flatnonzero(chunk.steps == self.step)

    def messages(self) -> Iterator[Batch]:
        """The batch messages, built from the file as it is checked again, a chunk at a time."""
        for chunk in self.check_chunks():
            yield from chunk_messages(chunk, self.kept(chunk), self.deployment)

    @property
    def batches(self) -> tuple[Batch, ...]:
        """Every message at once (in memory: for tests and the benchmark's raw baseline)."""
        return tuple(self.messages())

    def line_of(self, index: int) -> int | None:
        """Line of the ``index``-th report sent (message by message, as :func:`send_upload`
        sends them; reads the file again)."""
        for batch in self.messages():
            if index < batch.index.size:
                return self.line_of_row(int(batch.index[index]))
            index -= batch.index.size
        return None


# -- checking -----------------------------------------------------------------------------
def open_upload(path: str | Path, deployment, roster=None) -> Upload:
    """The report file at ``path``, not read yet; :class:`ReportFileError` for a type of file
    not read here or a missing file. ``roster``: the deployment's (made from its configuration
    when needed: a roster file, or an error to name)."""
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
    return Upload(path, kind, deployment, _roster_maker(deployment, roster))


def read_upload(path: str | Path, deployment, roster=None) -> Upload:
    """Check a whole report file a chunk at a time, sending nothing (kept: per-step counts and
    the check's bitmaps); :class:`ReportFileError` if any report would be rejected by the
    workers' stateless checks or repeats a (user, step) of the file."""
    upload = open_upload(path, deployment, roster)
    check = _file_check(upload)
    for _ in checked_chunks(upload, check):
        pass
    return dc_replace(
        upload,
        reports_in_file=check.reports,
        counts=dict(check.counts),
        first_rows=dict(check.first_rows),
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


def _file_check(upload: Upload) -> FileCheck:
    deployment = upload.deployment
    return FileCheck(
        deployment.horizon, deployment.n, UserRows(deployment.roster, upload.roster_of)
    )


def checked_chunks(upload: Upload, check: FileCheck) -> Iterator[Columns]:
    """The file's chunks in order, each yielded once ``check`` passed it (counted, its users
    marked in the bitmaps); :class:`ReportFileError` at the first chunk holding a report the
    workers would reject, naming it. pyarrow reads the file; one it cannot read as a table is
    checked whole by the per-report checker (which names a bad line) and read by it from the
    first report not yet yielded."""
    keep_freed_memory()  # chunk after chunk of numpy temporaries: not faulted in again each time
    done = 0
    try:
        for chunk in read_ahead(arrow_chunks(upload.path, upload.kind, upload.deployment)):
            _pass(upload, check, chunk)
            done += len(chunk)
            yield chunk
        return
    except NotTabular:  # the per-report checker reads it (and raises, naming the line)
        pass
    check_report_file(upload.path, upload.deployment, upload.roster_of())
    for chunk in read_ahead(_from(report_chunks(upload.path, upload.deployment), done)):
        _pass(upload, check, chunk)
        yield chunk


def _pass(upload: Upload, check: FileCheck, chunk: Columns) -> None:
    problem = check.problem(chunk)
    if problem is not None:
        _refuse(upload, problem, chunk)


def _from(chunks: Iterator[Columns], start: int) -> Iterator[Columns]:
    """The chunks' reports from position ``start`` on."""
    for chunk in chunks:
        if chunk.start + len(chunk) <= start:
            continue
        if chunk.start < start:
            cut = start - chunk.start
            chunk = Columns(
                start,
                chunk.users.slice(cut),
                chunk.steps[cut:],
                {name: codes[cut:] for name, codes in chunk.codes.items()},
            )
        yield chunk


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
        f"row {at + 1}: {detail}; the workers would dead-letter it",
    )


# -- lines --------------------------------------------------------------------------------
def _line_of(upload: Upload, position: int) -> int:
    """Line of the report at ``position`` (0-based) in the file (Parquet: its row, 1-based).
    When the file was checked whole and has exactly one line per report (plus the CSV header)
    that is arithmetic; otherwise (blank lines, quoted line breaks, a file sent in one pass) the
    per-report reader counts."""
    if upload.kind == "parquet":
        return position + 1
    if upload.counts and upload.one_line_per_report:
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


# -- the producer ---------------------------------------------------------------------------
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


# -- sending ------------------------------------------------------------------------------
def send_upload(
    upload: Upload,
    bootstrap: str,
    topic: str,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 60.0,
    early: EarlyProducer | None = None,
    refused: Callable[[int], str | None] | None = None,
) -> UploadResult:
    """Check and send the file in one pass: each chunk checked, built and handed to the producer
    (acks=all, each message to its partition, with the upload's header); once every message is
    acknowledged, the commit records (:class:`pipeline.upload_send.StagedSend`). The result
    counts reports (a message's reports are acknowledged together); a failure names the position
    in the file of the message's first report, and a message not acknowledged aborts the upload
    (``committed`` False: nothing of it is accepted).

    ``refused``: why the workers would refuse a step now (None: they take it), asked for each
    step as its first report comes; a refused step stops the upload (:class:`StepRefused`).
    A check's or a step's refusal, an error or KeyboardInterrupt before anything was handed to the
    producer is raised as it is (nothing sent); after, abort records are sent and
    :class:`UploadAborted` is raised with it as ``cause``. ``replace``: each message carries the
    correction header. ``early``: the producer made while the file was checked (closed here; its
    :class:`pipeline.producer.TopicMissing` raised here, nothing sent)."""
    producer = early.get() if early is not None else batch_producer(bootstrap)
    staged = StagedSend(producer, topic, replace, progress)
    staged.total = len(upload)  # known when the file was checked first, else 0
    start, check, admitted = time.monotonic(), _file_check(upload), set[int]()
    per_partition = np.zeros(upload.deployment.topics.partitions, dtype=np.int64)
    stopped = True
    try:
        try:
            for chunk in checked_chunks(upload, check):
                kept = upload.kept(chunk)
                if refused is not None:
                    _admit(upload.step, check, admitted, refused)
                for batch in chunk_messages(chunk, kept, upload.deployment):
                    per_partition[batch.partition] += batch.index.size
                    if per_partition[batch.partition] > uploads.MAX_UPLOAD_REPORTS:
                        raise _too_many(upload, batch.partition)
                    staged.send(batch)
            staged.settle(timeout)
        except BaseException as err:
            if not staged.started:
                raise
            staged.abort()
            staged.result.seconds = time.monotonic() - start
            raise UploadAborted(err, staged.result) from err
        with deferred_interrupt():  # the commit records go out whole, or the abort's
            result = staged.finish(timeout, start)
        stopped = not result.committed
    finally:
        # aborted or not ended: what is still unsent is moot, and the broker may not answer
        close_producer(producer, 1.0 if stopped else None)
    counts = dict(check.counts)
    result.counts = counts if upload.step is None else {upload.step: counts.get(upload.step, 0)}
    result.counts = {t: n for t, n in result.counts.items() if n}
    return result


def _too_many(upload: Upload, partition: int) -> ReportFileError:
    return ReportFileError(
        upload.path,
        None,
        None,
        f"more than {uploads.MAX_UPLOAD_REPORTS:,} of its reports are of users of reports "
        f"partition {partition}: one upload sends at most that many to a partition (a report's "
        "place in the upload is 24 bits); send the file in parts",
    )


def _admit(
    only: int | None, check: FileCheck, admitted: set[int], refused: Callable[[int], str | None]
) -> None:
    """:class:`StepRefused` for the first step of the file checked so far (``only``: that step
    only), not asked about before, that the workers would refuse now (the first in the file, by
    its first report)."""
    seen = check.first_rows
    new = [t for t in seen if t not in admitted and (only is None or t == only)]
    for step in sorted(new, key=seen.__getitem__):
        why = refused(step)
        if why is not None:
            raise StepRefused(step, seen[step], why)
        admitted.add(step)


def upload_file(
    path: str | Path,
    deployment,
    bootstrap: str,
    roster=None,
    step: int | None = None,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> UploadResult:
    """Check and send a report file in one pass (``step``: only that step's reports;
    :func:`send_upload`). A bad report raises :class:`ReportFileError` with nothing sent when it
    is in the first chunk, else :class:`UploadAborted` (some messages sent, then aborted: nothing
    accepted); :class:`pipeline.producer.TopicMissing` (nothing sent, no topic made) when the
    deployment's reports topic does not exist. The producer is made while the file is opened
    (:class:`EarlyProducer`)."""
    from pipeline.stream.kafka.topics import topic_names

    topic = topic_names(deployment)["reports"]
    early = EarlyProducer(bootstrap, topic, deployment.name)
    try:
        upload = open_upload(path, deployment, roster)
    except BaseException:
        early.close()
        raise
    if step is not None:
        upload = dc_replace(upload, step=step)
    return send_upload(upload, bootstrap, topic, replace, progress, early=early)
