"""The operator's commands (curator side): `produce`, `close`, `status`, `plan`, `dead-letters`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from pipeline.cli.common import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_REJECTED,
    EXIT_RUNTIME,
    _endpoints,
    _fail,
    _load,
    _stale,
    _up_record,
)
from pipeline.cli.config_check import refuse_if_started_differently, refuse_other_configuration

if TYPE_CHECKING:
    from pipeline.config import Deployment


# -- producing and controlling ------------------------------------------------------------------
def _producer(deployment: Deployment):
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.report_producer import ReportProducer
    from pipeline.stream.kafka.topics import topic_names

    broker, _ = _endpoints(deployment)
    return ReportProducer(
        broker, deployment, Roster.from_config(deployment.roster), topic_names(deployment)
    )


def _intake(deployment: Deployment, wait: float):
    """(store, view): the workers' intake counts once they have handled the reports sent so far."""
    from pipeline.stream.ingest.intake_view import intake_view
    from pipeline.stream.kafka.topics import topic_names
    from pipeline.stream.state.store import StateStore

    broker, redis_url = _endpoints(deployment)
    store = StateStore.from_url(redis_url, deployment.name)
    refuse_other_configuration(deployment, store)  # before any count or spend is shown for it
    names = topic_names(deployment)
    from pipeline.producer import progress_printer
    from pipeline.stream.kafka.topic_presence import TopicsMissing

    try:
        return store, intake_view(
            store,
            broker,
            names["reports"],
            deployment.topics.partitions,
            wait=wait,
            repartition_topic=names["repartition"],
            progress=_changes_only(
                progress_printer("waiting for the workers: handled", " records sent before")
            ),
        )
    except TopicsMissing as err:  # never started, or another broker: said, nothing created
        raise err.of_deployment(deployment.name, names) from None


def _changes_only(show, every: float = 2.1):
    """A progress callback that passes each (done, total) on once more after ``every`` seconds and then
    no more: the printer (pipeline.producer.progress_printer) stays silent for its first 2 s, so a wait
    stuck at one value still says it once, and a wait that has counted everything and waits on
    something else (reports lost with the broker's log) says "handled 114 of 114" once, not every
    2 s until it gives up."""
    last: list = [None, 0.0, False]  # the value, when it was first seen, passed on again since

    def call(done: int, total: int) -> None:
        now = time.monotonic()
        if (done, total) != last[0]:
            last[:] = [(done, total), now, False]
            show(done, total)
        elif not last[2] and now - last[1] >= every:
            last[2] = True
            show(done, total)

    return call


def _step_refused(deployment: Deployment, step: int, window: range) -> str | None:
    """Why the workers would dead-letter reports of ``step`` now (None: they accept them)."""
    if step < window.start:
        return f"step {step} is closed (steps up to {window.start - 1} are): the workers would dead-letter it as late"
    if step > window.stop - 1:
        return (
            f"step {step} is more than steps.max_ahead = {deployment.steps.max_ahead} step(s) past the open step "
            f"{window.start}: the workers would dead-letter every report as future_step. Close step "
            f"{step - deployment.steps.max_ahead - 1} first (dpstream close), then send it"
        )
    return None


def cmd_produce(args) -> int:
    """Send one step's reports, never more than the deployment accepts now (see docs/streaming.md), then
    wait for the workers' verdict on them (docs/own-data.md). Ctrl-C: one line, exit 130."""
    stage = ["starting"]  # what produce was doing, for the line an interrupt prints
    try:
        with contextlib.ExitStack() as closing:  # the early producer, whatever the way out
            return _produce(args, stage, closing)
    except KeyboardInterrupt:
        return _fail(
            EXIT_INTERRUPTED,
            f"interrupted (Ctrl-C) while {stage[0]}: whatever the "
            "broker acknowledged before stays on the log and the "
            "workers take or reject it; `dpstream status` and "
            "`dpstream dead-letters` show what they hold",
        )


def _early_producer(deployment: Deployment, closing: contextlib.ExitStack):
    """The upload's producer, made in a thread while the file is checked
    (:class:`pipeline.upload.EarlyProducer`: the reports topic checked first, nothing sent, no
    topic made). None when the broker is not known without a word (no `up`, a stale one, a
    secret unreadable): the usual path then says why, after the file's check as before."""
    import io

    from pipeline.stream.kafka.topics import topic_names
    from pipeline.upload import EarlyProducer

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            broker, _ = _endpoints(deployment, check=False)
    except (SystemExit, Exception):  # noqa: BLE001 - said in its place by the usual path
        return None
    early = EarlyProducer(broker, topic_names(deployment)["reports"], deployment.name)
    closing.callback(early.close)  # a no-op once the send has taken it
    return early


def _early_mark(deployment: Deployment, early):
    """The dead-letter mark taken beside the early producer
    (:class:`pipeline.cli.verdict.EarlyMark`; None without one)."""
    from pipeline.cli.verdict import EarlyMark

    return None if early is None else EarlyMark(deployment, early.bootstrap, early)


def _missing_topic(deployment: Deployment, early) -> tuple[str | None, Any]:
    """(why nothing can be sent when the reports topic does not exist, None when it does; the
    early producer, None when making it failed), checked before anything names the topic: the
    workers' counts read it, and a client naming a missing topic makes the embedded broker
    create it (pipeline.producer.require_topic); reports sent then would go to a topic no
    worker reads. ``early``: the producer made while the file was checked, which checked the
    topic first."""
    from pipeline.producer import TopicMissing, require_topic
    from pipeline.stream.kafka.topics import topic_names

    # the broker and Redis answer (else one line and exit at once, as before: the early
    # producer's client would wait for its bootstrap's timeout)
    broker, _ = _endpoints(deployment)
    if early is not None:
        try:
            early.wait()
            return None, early
        except TopicMissing:
            return _absent(deployment, broker), None
        except Exception:  # noqa: BLE001 - asked again below, by a client of its own
            pass
    try:
        require_topic(broker, topic_names(deployment)["reports"], deployment.name)
    except TopicMissing:
        return _absent(deployment, broker), None
    return None, None


def _absent(deployment: Deployment, broker: str) -> str:
    """What a missing reports topic means, said as the analysts' commands say a deployment the
    broker does not have (:func:`pipeline.stream.kafka.topic_presence.absent_deployment`): no
    deployment of that name when the broker has none of its topics, else which it lacks."""
    from pipeline.stream.kafka.topic_presence import absent_deployment
    from pipeline.stream.kafka.topics import topic_names

    names = topic_names(deployment)
    return absent_deployment(deployment.name, broker, names, [names["reports"]])


def _produce(args, stage: list[str], closing: contextlib.ExitStack) -> int:
    from pipeline.stream.ingest.intake_view import open_window
    from pipeline.stream.ingest.report_files import ReportFileError
    from pipeline.upload import open_upload, read_upload

    deployment = _load(args.config)
    path = args.jsonl or args.csv or args.parquet
    if args.simulate and deployment.production:
        return _fail(
            EXIT_CONFIG,
            f"--simulate is refused: deployment {deployment.name!r} has production: "
            "true and takes only the curator's data (--csv, --jsonl or --parquet "
            "FILE; docs/own-data.md)",
        )
    if not path and not args.simulate:
        return _fail(
            EXIT_CONFIG,
            "produce needs the reports to send: --csv, --jsonl or --parquet FILE "
            "(your data; docs/own-data.md), or --simulate for simulated "
            "reports (not on a production deployment)",
        )
    if args.step is not None and not 1 <= args.step <= deployment.horizon:
        return _fail(EXIT_CONFIG, f"--step must be in 1..{deployment.horizon}, got {args.step}")
    if args.attribute is not None and args.attribute not in deployment.attributes:
        return _fail(
            EXIT_CONFIG,
            f"--attribute {args.attribute!r} is not an attribute of "
            f"deployment {deployment.name!r} ({', '.join(deployment.attributes)})",
        )
    if args.replace and not path:
        return _fail(
            EXIT_CONFIG,
            "--replace needs a file (--csv, --jsonl or --parquet) of the corrected reports",
        )
    found = None
    # the producer made while the file is checked (not for a dry run: nothing is sent)
    early = _early_producer(deployment, closing) if path and not args.dry_run else None
    marker = _early_mark(deployment, early)
    if path:  # a send checks the file as it sends it; else it is checked whole first (a dry
        # run; a broker not known without a word, which is said after the file's own problems)
        stage[0] = f"checking {path}"
        try:
            opened = read_upload if early is None else open_upload
            found = opened(path, deployment)
        except ReportFileError as err:
            return _fail(EXIT_CONFIG, f"nothing sent: {err}")
    stage[0] = "checking the reports topic"
    missing, early = _missing_topic(deployment, early)
    if missing is not None:  # a configuration error, as for the analysts' commands: nothing sent
        return _fail(EXIT_CONFIG, missing)
    if early is None and path and not args.dry_run:  # the broker is known now, or it failed
        early = _early_producer(deployment, closing)
        marker = _early_mark(deployment, early)
    stage[0] = "waiting for the workers' counts"
    _, view = _intake(deployment, wait=args.wait)
    window = open_window(deployment, view.closing)
    if not len(window):
        return _fail(EXIT_REFUSED, f"nothing sent: every step (1..{deployment.horizon}) is closed")
    if found is not None:
        held = {t for t in window if view.reported(t)}
        if not args.dry_run and not args.replace and held and _may_repeat(found, held):
            # the workers hold reports of a step of the file: the file is checked whole first, to
            # count its duplicates exactly before anything is sent (pipeline.held_reports)
            stage[0] = f"checking {path}"
            try:
                found = read_upload(path, deployment)
            except ReportFileError as err:
                return _fail(EXIT_CONFIG, f"nothing sent: {err}")
        if args.step is not None:
            found = found.only_step(args.step)
            if found.present and not len(found):  # checked whole: known now
                return _fail(
                    EXIT_CONFIG, f"nothing sent: {path} has no report for step {args.step}"
                )
        for file_step, line in sorted(
            found.first_lines.items(), key=lambda kv: kv[1]
        ):  # the first refused line (a file checked whole; else each step as it comes)
            why = _step_refused(deployment, file_step, window)
            if why:
                count = found.counts[file_step]
                return _fail(
                    EXIT_REFUSED,
                    f"nothing sent: {path}:{line}: {why} (the file's {count:,} reports of step "
                    f"{file_step})",
                )
        return _send_file(deployment, found, args, view, window, stage, early, marker)
    step: int | None = args.step
    if step is None:  # the next open step without reports yet
        step = next((t for t in window if view.reported(t) == 0), None)
        if step is None:
            return _fail(
                EXIT_REFUSED,
                f"nothing sent: the steps the workers accept now ({window.start}.."
                f"{window.stop - 1}) already have reports; close step {window.start} first",
            )
    why = _step_refused(deployment, step, window)
    if why is None and view.reported(step):
        why = (
            f"step {step} already has {view.reported(step):,} accepted reports: sending it again would only "
            f"be dead-lettered as duplicate"
        )
    if why:
        return _fail(EXIT_REFUSED, f"nothing sent: {why}")
    if args.dry_run:
        print(
            f"dry run: would send {deployment.n:,} simulated reports for step {step}; nothing sent"
        )
        return EXIT_OK
    return _send_simulated(deployment, step, args, stage)


def _may_repeat(found, held: set[int]) -> bool:
    """Whether the file may hold reports of a step the workers hold reports of: its first chunk
    does (or is not read so). A later chunk of another such step is sent in the one pass, and the
    workers' verdict counts its duplicates."""
    first = found.first_steps()
    return first is None or bool(first & held)


def _send_simulated(deployment: Deployment, step: int, args, stage: list[str]) -> int:
    """Simulated reports of every attribute (or ``--attribute``) for ``step``
    (:mod:`pipeline.sim.step_values`)."""
    from pipeline.cli.verdict import mark_dead_letters
    from pipeline.fates import Receipt
    from pipeline.sim.step_values import simulated_step
    from pipeline.stream.kafka.topics import topic_names

    broker, _ = _endpoints(deployment)
    mark = mark_dead_letters(deployment, broker)
    receipt = Receipt(topic_names(deployment)["reports"])
    values = simulated_step(deployment, deployment.n, step, args.seed)
    if args.attribute is not None:
        values = {args.attribute: values[args.attribute]}
    stage[0] = f"sending simulated reports for step {step}"
    prod = _producer(deployment)
    interrupted = True
    try:
        n = prod.send_step(step, values, receipt=receipt)
        interrupted = False
    finally:
        prod.close(timeout=0 if interrupted else None)
    sent = f"sent {n} simulated reports for step {step} (all acknowledged)"
    return _verdict(deployment, receipt, mark, args, stage, sent)


def _verdict(deployment: Deployment, receipt, mark, args, stage: list[str], sent: str) -> int:
    """Print ``sent`` (what the broker acknowledged), then the workers' verdict on it (skipped with
    --no-wait). The stage is named before the line: a Ctrl-C once the line is out interrupted the
    wait for the verdict, not the sending."""
    from pipeline.cli.verdict import report_fates

    if not args.no_wait:
        stage[0] = "waiting for the workers' verdict on the reports sent (on the broker's log)"
    print(sent)
    if args.no_wait:
        print(
            "not waiting for the workers' verdict (--no-wait): `dpstream dead-letters` lists "
            "rejections"
        )
        return EXIT_OK
    return report_fates(deployment, receipt, mark, args.timeout)


def _send_file(
    deployment: Deployment, found, args, view, window, stage: list[str], early, marker=None
) -> int:
    """A report file as batch messages (pipeline.upload): the topic must exist, each message goes
    to the partition owning its users, the file is checked as it is sent, and what the broker
    acknowledged is what is reported; then the workers' verdict on those reports. The workers
    hold the upload's messages until its commit (sent once every one is acknowledged): a stop
    part way (a bad report, a refused step, a message not acknowledged, Ctrl-C) aborts it, and
    nothing of the file is accepted. ``found``: the file, checked whole when the workers hold
    reports of a step of its first chunk (its duplicates counted exactly before the send), else
    not read yet.
    ``early``: the producer made while the file was opened
    (:class:`pipeline.upload.EarlyProducer`) and ``marker`` the dead-letter mark taken beside
    it (:class:`pipeline.cli.verdict.EarlyMark`)."""
    from pipeline.cli.verdict import held_conflicts, mark_dead_letters
    from pipeline.producer import TopicMissing, progress_printer
    from pipeline.stream.kafka.topics import topic_names
    from pipeline.upload import EarlyProducer, send_upload

    if args.dry_run:
        stage[0] = "reading the reports log for what the workers hold"
        return _dry_run(deployment, found, args, view)
    # corrections (--replace) replace held reports: no duplicate to foresee; a file not checked
    # whole yet: the workers hold no report of an open step
    held = [] if args.replace else held_conflicts(deployment, view, found.counts)
    broker, _ = _endpoints(deployment)
    if held:  # some of the file's steps have reports already: counted exactly, as --dry-run does
        stage[0] = "reading the reports log for what the workers hold"
        exact = _exact_duplicates(deployment, broker, found, view)
        if exact is not None:
            lines, total, note = exact
            if total == len(found):
                return _fail(
                    EXIT_REFUSED,
                    f"nothing sent: every one of the {len(found):,} reports is of a user the "
                    f"workers already hold a report of for its step ({note}): all would be "
                    "dead-lettered as duplicate (the first report of a (user, step) wins; "
                    "--replace sends them as corrections)",
                )
            held = lines
    for line in held:
        print(f"WARNING: {line}", file=sys.stderr)
    topic = topic_names(deployment)["reports"]
    if early is None:  # the broker's address was not known without a word (not expected here)
        early = EarlyProducer(broker, topic, deployment.name)
    try:
        early.wait()  # the topic exists (checked before any client named it)
    except TopicMissing:
        return _fail(EXIT_CONFIG, _absent(deployment, broker))
    mark = marker.get(deployment, broker) if marker else mark_dead_letters(deployment, broker)
    stage[0] = f"sending {found.path}"
    try:
        result = send_upload(
            found,
            broker,
            topic,
            args.replace,
            progress_printer("acknowledged", " reports"),
            early=early,
            refused=lambda step: _step_refused(deployment, step, window),
        )
    except Exception as err:  # noqa: BLE001 - nothing sent, or sent and aborted: said
        return _upload_stopped(found, err)
    what = "corrections" if args.replace else "reports"
    if not result.counts:
        which = f" for step {args.step}" if args.step is not None else ""
        return _fail(EXIT_CONFIG, f"nothing sent: {found.path} has no report{which}")
    if result.failed:
        at, why = result.failed[0]
        return _fail(
            EXIT_RUNTIME,
            f"sent {result.sent:,} {what}, {result.acknowledged:,} acknowledged; "
            f"{len(result.failed):,} not (first: line {found.line_of_row(at)}: {why}); "
            f"{_aborted(result)}; send the file again",
        )
    if result.unended:
        return _fail(
            EXIT_RUNTIME,
            f"sent {result.acknowledged:,} {what} (all acknowledged), but the commit records of "
            f"reports partition(s) {_partitions(result.unended)} were not acknowledged: the "
            "other partitions' reports are committed; if those records were not stored, the "
            "workers hold these partitions' reports until the second close marker after them, "
            "then dead-letter them `uncommitted` (`dpstream status` shows the uploads held, "
            "`dpstream dead-letters` the rest)",
        )
    steps = ", ".join(map(str, sorted(result.counts)))
    plural = "s" if len(result.counts) > 1 else ""
    sent = f"sent {result.acknowledged} {what} for step{plural} {steps} (all acknowledged)"
    return _verdict(deployment, result.receipt, mark, args, stage, sent)


def _upload_stopped(found, err: Exception) -> int:
    """The line and exit code of an upload stopped by ``err``: before anything was sent
    (nothing sent), or after (:class:`pipeline.upload.UploadAborted`: aborted, nothing of the
    file accepted). A bad report is a bad file (2), a refused step the deployment's state (3),
    Ctrl-C 130, anything else a runtime failure (1)."""
    from pipeline.stream.ingest.report_files import ReportFileError
    from pipeline.upload import StepRefused, UploadAborted

    cause: BaseException = err.cause if isinstance(err, UploadAborted) else err
    if isinstance(cause, ReportFileError):
        code, why = EXIT_CONFIG, str(cause)
    elif isinstance(cause, StepRefused):
        line = found.line_of_row(cause.position)
        code, why = EXIT_REFUSED, f"{found.path}:{line}: {cause.why}"
    elif isinstance(cause, KeyboardInterrupt):
        code, why = EXIT_INTERRUPTED, f"interrupted (Ctrl-C) while sending {found.path}"
    else:
        code, why = EXIT_RUNTIME, f"{type(cause).__name__}: {cause}"
    if not isinstance(err, UploadAborted):
        if code == EXIT_RUNTIME:
            raise err
        return _fail(code, f"nothing sent: {why}")
    return _fail(code, f"{why}; {_aborted(err.result)}")


def _aborted(result) -> str:
    """What an aborted upload (``result``: :class:`pipeline.upload_send.UploadResult`) leaves."""
    text = (
        f"the upload was aborted: nothing of the file was accepted (the {result.sent:,} reports "
        "sent before were withdrawn by abort records; the workers drop them)"
    )
    if result.unended:
        text += (
            f"; the abort records of reports partition(s) {_partitions(result.unended)} were not "
            "acknowledged: if they were not stored, the workers hold those messages until the "
            "second close marker after them, then dead-letter them `uncommitted` (none is "
            "accepted either way)"
        )
    return text


def _partitions(partitions: list[int]) -> str:
    return ", ".join(map(str, sorted(set(partitions))))


def _exact_duplicates(deployment: Deployment, broker: str, found, view):
    """(a line per step with duplicates, how many of the file's reports are, the count's note),
    counted exactly from the reports log (:mod:`pipeline.held_reports`); None when the log could
    not be read (the workers' counts then only bound them)."""
    from pipeline.held_reports import held_reports

    try:
        held = held_reports(deployment, broker, view, found.steps(), found.roster_of())
    except Exception as err:  # noqa: BLE001 - the bound from the counts is said instead
        print(
            f"WARNING: the reports log could not be read to count duplicates exactly ({err})",
            file=sys.stderr,
        )
        return None
    return _counted(held, found)


def _counted(held, found) -> tuple[list[str], int, str]:
    """(a line per step of the file with duplicates, how many of its reports are, the note on
    what the count covers) from the held reports."""
    lines, total = [], 0
    for step in sorted(found.steps()):
        duplicates = held.duplicates(step, found.present[step])
        total += duplicates
        if duplicates:
            lines.append(
                f"step {step}: {duplicates:,} of the {found.counts[step]:,} reports are of "
                "users the workers already hold a report of: dead-lettered as duplicate (the "
                "first report of a (user, step) wins; --replace corrects them)"
            )
    return lines, total, held.note


def _dry_run(deployment: Deployment, found, args, view) -> int:
    """What the workers would make of the checked file now: its reports of (user, step) pairs
    they hold a report of already are duplicates, counted exactly from the reports log
    (:mod:`pipeline.held_reports`); corrections (--replace) replace what is held."""
    from pipeline.held_reports import held_reports

    steps = ", ".join(map(str, sorted(found.steps())))
    plural = "s" if len(found.steps()) > 1 else ""
    if args.replace:
        print(
            f"dry run: {len(found):,} corrections for step{plural} {steps} pass the workers' "
            "checks; each replaces the report held for its user and step; nothing sent"
        )
        return EXIT_OK
    broker, _ = _endpoints(deployment)
    held = held_reports(deployment, broker, view, found.steps(), found.roster_of())
    lines, total, note = _counted(held, found)
    for line in lines:
        print(f"dry run: {line}")
    if total:
        return _fail(
            EXIT_REJECTED,
            f"dry run: {total:,} of the {len(found):,} reports would be rejected as duplicate "
            f"({note}); nothing sent",
        )
    print(
        f"dry run: {len(found):,} reports for step{plural} {steps} pass the workers' checks, "
        f"none a duplicate ({note}); nothing sent"
    )
    return EXIT_OK


def cmd_close(args) -> int:
    """Close steps through --step: say what the workers hold and what it spends; refuse a step whose
    reports were lost with the broker's log (without --force). The close guard only warns: a refusal
    on coverage would make the close time a function of an un-noised count (docs/privacy.md)."""
    from pipeline.plan import spend_of_steps
    from pipeline.stream.ingest.intake_view import close_assessment

    deployment = _load(args.config)
    if not 1 <= args.step <= deployment.horizon:
        return _fail(EXIT_CONFIG, f"--step must be in 1..{deployment.horizon}, got {args.step}")
    if (
        deployment.steps.close == "deadline" and not args.force
    ):  # before anything is read: nothing depends on counts
        return _fail(
            EXIT_REFUSED,
            f"refusing a manual close: deployment {deployment.name!r} closes its steps on a "
            f"deadline (steps.close: deadline, every {deployment.steps.deadline_seconds:g} s); a "
            "close now is irreversible and would cut the step's upload short. Pass --force "
            "to close anyway",
        )
    store, view = _intake(deployment, wait=args.wait)
    steps = range(view.closing + 1, args.step + 1)
    if not len(steps):
        released = store.last_released()
        which = (
            f"step {view.closing} is"
            if released + 1 == view.closing
            else f"steps {released + 1}..{view.closing} are"
        )
        pending = (
            f"; {which} closed but not released yet: the releaser is "
            "gathering their partials, or they were lost with the broker's log — it writes their close "
            "markers again when it starts (docs/streaming.md, 'A lost close'): if they are not released "
            "soon, restart it (`dpstream down`, then `dpstream up`)"
            if released < view.closing
            else ""
        )
        print(f"steps through {view.closing} are already closed; nothing to do{pending}")
        return EXIT_OK
    for p, count in view.unhandled.items():
        if count:
            print(
                f"WARNING: reports partition {p} has {count:,} records no worker has handled yet; "
                "the counts below miss them",
                file=sys.stderr,
            )
    for upload, held in view.held_uploads().items():
        print(
            f"WARNING: upload {upload}: {held['messages']:,} message(s) held by the workers, not "
            "committed yet (a produce still sending?): its reports count only at its commit, and a "
            "report of a step closed before then is late",
            file=sys.stderr,
        )
    checks = close_assessment(deployment, view, steps)
    for c in checks:
        print(
            f"step {c.step}: {c.reported:,} of {c.users:,} users reported ({c.imputed_share:.1%} imputed, as the "
            f"workers' state holds it); rejected while open: {sum(c.rejected.values()):,} {c.rejected or ''}".rstrip()
        )
        for w in c.warnings:
            print(f"WARNING: {w}", file=sys.stderr)
    for line in view.log_lost_warnings():
        print(f"LOST: {line}", file=sys.stderr)
    spend = spend_of_steps(deployment, steps)
    label = f"steps {steps.start}..{steps.stop - 1}" if len(steps) > 1 else f"step {steps.start}"
    print(
        f"closing {label} releases {'them' if len(steps) > 1 else 'it'} and spends: "
        + (
            ", ".join(
                f"{name} {next(iter(v))}={v[next(iter(v))]:.6g} ({v['share_of_release']:.1%} of its budget)"
                for name, v in spend.items()
            )
            or "nothing"
        )
    )
    if not args.force:
        if len(steps) > 1:
            return _fail(
                EXIT_REFUSED,
                f"refusing to close {len(steps)} steps at once without --force "
                f"(steps {steps.start}..{steps.stop - 1})",
            )
        lost = [t for t in steps if t in view.lost()]
        if lost or any(view.stale.values()):
            return _fail(
                EXIT_REFUSED,
                f"refusing to close step(s) {lost or list(steps)}: reports the workers had "
                "counted were lost with the broker's log (LOST above); send them again, or "
                "pass --force to close with those users imputed",
            )
    from pipeline.stream.control.signatures import MAX_COMMAND_STEPS
    from pipeline.stream.control.signing_keys import KeyUnavailable

    # signed for every step not released yet: the releaser may be behind the closes this view saw
    first = min(store.last_released(), view.closing) + 1
    if args.step - first + 1 > MAX_COMMAND_STEPS:
        return _fail(
            EXIT_CONFIG,
            "nothing closed: a close command carries one signature per "
            f"step, at most {MAX_COMMAND_STEPS:,}; close through step "
            f"{first + MAX_COMMAND_STEPS - 1} first",
        )
    prod = _producer(deployment)
    try:
        prod.close_step(args.step, first=first)
    except KeyUnavailable as err:
        return _fail(EXIT_CONFIG, f"nothing closed: {err}")
    finally:
        prod.close()
    from pipeline.producer import progress_printer

    deadline, started = time.monotonic() + args.wait, time.monotonic()
    waiting = progress_printer(
        f"waiting for the releaser's close markers of step {args.step}", " s"
    )
    while store.last_closing() < args.step:
        waiting(int(time.monotonic() - started), int(args.wait))
        if time.monotonic() > deadline:
            return _fail(
                EXIT_RUNTIME,
                f"close of step {args.step} requested, but the releaser has not written its "
                f"close markers within {args.wait:g} s (is it running?)",
            )
        time.sleep(0.1)
    print(f"closed through step {args.step} (close markers written)")
    return EXIT_OK


def cmd_status(args) -> int:
    """The deployment's state: from the running `dpstream up` (or the configured services), or, when
    nothing runs, from the embedded Redis's data directory (started briefly, read, stopped)."""
    from pipeline.status_view import format_status, status_document
    from pipeline.stream.ingest.intake_view import IntakeView
    from pipeline.stream.state.store import StateStore

    deployment = _load(args.config)
    rec = _up_record(deployment.name)
    running = deployment.redis or os.environ.get("DPSTREAM_REDIS") or (rec and rec["alive"])
    if running:
        _, redis_url = _endpoints(deployment)
        store = StateStore.from_url(redis_url, deployment.name)
        try:
            intake = _intake(deployment, wait=args.wait)[
                1
            ].as_json()  # curator-side counts: the operator's terminal only
        except Exception as err:  # noqa: BLE001 - e.g. the broker is down: the rest of the status still shows
            intake = {"unavailable": f"{type(err).__name__}: {err}"}
        status = status_document(deployment, store, intake, f"Redis at {redis_url}")
    else:
        if rec:  # a killed `up` may have left its Redis running on the data directory
            raise SystemExit(_fail(EXIT_CONFIG, _stale(rec)))
        with _redis_at_rest(deployment) as (redis_url, where):
            store = StateStore.from_url(redis_url, deployment.name)
            refuse_other_configuration(deployment, store)
            view = IntakeView(store.last_closing(), deployment.topics.partitions, store.intake())
            status = status_document(
                deployment,
                store,
                view.as_json(),
                f"{where} (`dpstream up` is not running: the "
                "workers' counts are as they last wrote them; the broker's log is not checked)",
            )
    access = _broker_access(deployment, rec)
    if access:
        status["broker_access"] = access
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else format_status(status))
    if access and not args.json:
        print(f"broker access: {access}")
    if (
        rec and rec.get("alive") and rec.get("falling_behind")
    ):  # `up`'s lag watch (docs/streaming.md)
        print(f"WARNING: since {rec['falling_behind']}", file=sys.stderr)
    return EXIT_OK


def _broker_access(deployment, rec: dict | None) -> str | None:
    """Who can reach the embedded broker of a running `up` (None: a configured broker, or none running)."""
    if (
        deployment.broker
        or os.environ.get("DPSTREAM_BROKER")
        or not (rec and rec.get("alive") and rec.get("broker"))
    ):
        return None
    if rec.get("broker_tls"):
        return (
            f"the embedded broker at {rec['broker']} takes only clients with this deployment's certificate "
            f"(mutual TLS; files in {rec['broker_tls']}); no other local user reaches it"
        )
    return (
        f"the embedded broker at {rec['broker']} asks for no credentials: every local user reads and writes "
        "every topic (DPSTREAM_EMBEDDED_BROKER=open)"
    )


@contextlib.contextmanager
def _redis_at_rest(deployment: Deployment):
    """The embedded Redis of a stopped deployment, started on its data directory for one read."""
    from pipeline.stream.local.cluster import dpstream_home, endpoints_file
    from pipeline.stream.local.embedded import EmbeddedRedis

    data = dpstream_home() / deployment.name / "redis"
    if not data.is_dir():
        raise SystemExit(
            _fail(
                EXIT_CONFIG,
                f"deployment {deployment.name!r} names no broker/Redis, no `dpstream up` is "
                f"running for it (no {endpoints_file(deployment.name)}) and it has no state in "
                f"{data}",
            )
        )
    redis = EmbeddedRedis(data).start()
    try:
        yield redis.url, f"the embedded Redis's data in {data}"
    finally:
        redis.stop()


def cmd_dead_letters(args) -> int:
    """Rejected reports by reason (curator side: the dead-letter topic holds the original reports)."""
    from pipeline.consumer import read_to_end
    from pipeline.dead_letters import format_summary, summarise
    from pipeline.stream.kafka.topic_presence import TopicsMissing
    from pipeline.stream.kafka.topics import topic_names

    deployment = _load(args.config)
    refuse_if_started_differently(
        deployment
    )  # its topic names and reasons are the deployment's own
    broker, _ = _endpoints(deployment, redis=False)
    names = topic_names(deployment)
    topic = names["dead-letter"]
    messages: list[Any] = []
    try:
        read_to_end(broker, [topic], messages.append)
    except TopicsMissing as err:  # a deployment never started: said (exit 2), nothing created
        raise err.of_deployment(deployment.name, names) from None
    summary = summarise(messages, examples=args.examples)
    if args.json:
        print(json.dumps({reason: s.__dict__ for reason, s in summary.items()}))
    else:
        print(format_summary(summary, topic))
    return EXIT_OK


def cmd_plan(args) -> int:
    """Per release: allotment, padding, error bounds at its β, schedule; the total as (ε, δ);
    warnings. With --sweep or --target: the bounds over values of one key (pipeline.plan_sweep)."""
    from pipeline.plan_report import format_plan, plan_report

    deployment = _load(args.config)
    # a started deployment's plan is the one it runs under: another file's would be read as its own
    # (a sweep varies a key of the deployment's own file); not started: any file is planned
    refuse_if_started_differently(
        deployment, "; to plan another configuration, give it a deployment name of its own"
    )
    if getattr(args, "sweep", None) or getattr(args, "target", None):
        from pipeline.cli.plan_search import cmd_plan_search

        return cmd_plan_search(args, deployment)
    report = plan_report(deployment)
    print(json.dumps(report, indent=2) if args.json else format_plan(report))
    for line in report["warnings"]:
        print(f"WARNING: {line}", file=sys.stderr)
    return EXIT_OK
