"""What ``dpstream produce`` says after (and, with ``--dry-run``, before) sending: the workers'
verdict on its own reports (:mod:`pipeline.fates`) and what they already hold for the steps sent.

Curator side: the counts are the workers' (true counts, for the operator's terminal only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.background import in_daemon_thread
from pipeline.cli.common import EXIT_OK, EXIT_REJECTED, EXIT_RUNTIME, _endpoints, _fail

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = [
    "EarlyMark",
    "held_conflicts",
    "mark_dead_letters",
    "report_fates",
    "DEFAULT_FATE_TIMEOUT",
]

# seconds: the workers take ~10^5 reports/s and more (docs/performance.md), so 10^6 reports fit
DEFAULT_FATE_TIMEOUT = 120.0


def held_conflicts(deployment: Deployment, view, counts: dict[int, int]) -> list[str]:
    """For the steps of ``counts`` (step -> reports about to be sent) that the workers already
    hold accepted reports for: one line each, with how many reports are sure to be rejected as
    ``duplicate`` — a step's reports beyond its users without an accepted report yet
    (pigeonhole: the workers' counts do not say which users they are)."""
    lines = []
    for step, sending in sorted(counts.items()):
        held = view.reported(step)
        if not held:
            continue
        sure = max(0, sending + held - deployment.n)
        lines.append(
            f"step {step}: the workers already hold accepted reports of {held:,} of "
            f"{deployment.n:,} users; a report of one of them is rejected as duplicate (the "
            f"first report of a (user, step) wins): at least {sure:,} of the "
            f"{sending:,} to send" + (", all of them" if sure == sending else "")
        )
    return lines


def mark_dead_letters(deployment: Deployment, broker: str) -> dict:
    """Where the dead-letter log ends before a send: its dead letters come after."""
    from pipeline.fates import dead_letter_mark
    from pipeline.stream.kafka.topics import topic_names, topic_partitions

    return dead_letter_mark(
        broker, topic_names(deployment)["dead-letter"], topic_partitions(deployment)["dead-letter"]
    )


class EarlyMark:
    """:func:`mark_dead_letters` taken in a thread while the file is checked, once ``early`` (the
    upload's :class:`pipeline.upload.EarlyProducer`) found the reports topic: a probe naming a
    topic the embedded broker lacks would create it. Any mark taken before the send will do:
    another producer's dead letters after it are told apart by source position
    (:mod:`pipeline.fates`). A daemon thread, as the early producer's."""

    def __init__(self, deployment: Deployment, broker: str, early):
        def take() -> dict:
            early.wait()
            return mark_dead_letters(deployment, broker)

        self._mark = in_daemon_thread(take, "mark")

    def get(self, deployment: Deployment, broker: str) -> dict:
        """The mark; taken now when the thread could not (the send's own path says what failed)."""
        if self._mark.exception() is not None:
            return mark_dead_letters(deployment, broker)
        return self._mark.result()


def report_fates(deployment: Deployment, receipt, mark, timeout: float) -> int:
    """Wait (at most ``timeout`` s) for the workers' verdict on ``receipt``'s reports and print
    it. Exit code: 0 all accepted, EXIT_REJECTED some dead-lettered, EXIT_RUNTIME some not
    handled within the timeout."""
    from pipeline.fates import await_fates
    from pipeline.producer import progress_printer
    from pipeline.stream.kafka.topics import topic_names
    from pipeline.stream.state.store import StateStore

    broker, redis_url = _endpoints(deployment)
    store = StateStore.from_url(redis_url, deployment.name)
    waiting = progress_printer("waiting for the workers' verdict: handled", " reports")
    fates = await_fates(
        store,
        broker,
        topic_names(deployment),
        deployment.topics.partitions,
        receipt,
        mark,
        timeout,
        progress=waiting,
    )
    print(fates.summary())
    rejected = sum(fates.rejected.values())
    if rejected:
        return _fail(
            EXIT_REJECTED,
            f"{rejected:,} of the {fates.sent:,} reports sent were "
            "rejected by the workers (dead-lettered); `dpstream "
            "dead-letters --examples 3` shows why",
        )
    if fates.unknown:
        return _fail(
            EXIT_RUNTIME,
            f"{fates.unknown:,} reports sent and acknowledged were not "
            f"handled by the workers within {timeout:g} s (are they "
            "running? `dpstream status`); their fate is not known: "
            "`dpstream dead-letters` lists rejections later",
        )
    if fates.unapplied_forwards:
        return _fail(
            EXIT_RUNTIME,
            "reports forwarded between partitions were not all applied "
            f"within {timeout:g} s: some counted as accepted may still be "
            "rejected; `dpstream dead-letters` lists rejections later",
        )
    return EXIT_OK
