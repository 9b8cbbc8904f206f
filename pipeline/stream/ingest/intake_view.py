"""What the workers have taken in, for the operator: ``dpstream status``, ``close`` and ``produce``.

Curator-side only: the counts (reports accepted, rejected by reason, users reported and imputed per
step) come from the workers' intake snapshots in Redis (:class:`pipeline.stream.ingest.partition_state.Intake`)
and are shown on the operator's terminal, never published to a public topic.

* :func:`intake_view` sums the partitions' snapshots, after waiting (bounded) until every worker
  has handled its reports partition up to the true log end, so reports just sent are counted.
* :func:`close_assessment` compares each step about to close with the closed steps (imputed share
  and rejected share against their median; ``close_guard`` in the configuration); what closing
  will spend is the plan's (:func:`pipeline.plan.spend_of_steps`). Advisory: it warns, never refuses
  (a refusal would tie the public close time to an un-noised count).
* :func:`open_window` is the range of steps the workers accept now (the next step to close and
  ``steps.max_ahead`` after it): producing outside it would only fill the dead-letter topic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.stream.state.store import StateStore

__all__ = ["IntakeView", "intake_view", "StepCheck", "close_assessment", "open_window"]


@dataclass
class IntakeView:
    closing: int  # last step whose close markers the releaser wrote
    partitions: int
    snapshots: dict[int, dict[str, Any]]
    unhandled: dict[int, int] = field(default_factory=dict)  # partition -> records not yet handled
    # partition -> records its counts cover beyond the log's end: counted on a log the broker lost,
    # and no worker has restored the partition's checkpoint since (its counts are not what it holds)
    stale: dict[int, int] = field(default_factory=dict)

    @property
    def missing(self) -> list[int]:
        return [p for p in range(self.partitions) if p not in self.snapshots]

    def reported(self, step: int) -> int:
        """Users with an accepted report for ``step`` (an open or a closed step)."""
        total = 0
        for snap in self.snapshots.values():
            closed = snap["history"].get(str(step))
            total += closed["reported"] if closed is not None else snap["open"].get(str(step), 0)
        return total

    def lost(self) -> dict[int, int]:
        """Per open step, the reports the workers had counted on a log the broker has since lost (the
        state restored from their checkpoints does not hold them: see ``IngestCore.note_lost_log``)."""
        out: dict[int, int] = {}
        for snap in self.snapshots.values():
            for t, before in snap.get("lost", {}).items():  # users counted before the loss
                missing = int(before) - int(snap["open"].get(t, 0))
                if int(t) > snap["closed"] and missing > 0:
                    out[int(t)] = out.get(int(t), 0) + missing
        return dict(sorted(out.items()))

    def held_uploads(self) -> dict[str, dict[str, int]]:
        """Uploads the workers hold, not yet committed (``pipeline.stream.ingest.uploads``): per
        upload id, messages held over all partitions and the most closes one partition held it
        through (at 2 it is dead-lettered ``uncommitted``)."""
        out: dict[str, dict[str, int]] = {}
        for snap in self.snapshots.values():
            for upload, h in snap.get("held", {}).items():
                seen = out.setdefault(upload, {"messages": 0, "closes": 0})
                seen["messages"] += int(h["messages"])
                seen["closes"] = max(seen["closes"], int(h["closes"]))
        return dict(sorted(out.items()))

    def log_lost_warnings(self) -> list[str]:
        """One line per sign of a lost log, for the operator's terminal (empty: none)."""
        lines = [
            f"step {t}: {n:,} reports the workers had counted are gone: the broker lost its log (a memory-only "
            f"broker restarted?) and the workers' checkpoints hold {self.reported(t):,}; send them again "
            f"(dpstream produce --step {t}) before closing it"
            for t, n in self.lost().items()
        ]
        lines += [
            f"reports partition {p}: the workers counted {n:,} records past the end of its log: the broker lost "
            "it, and no worker has restored its checkpoint since (are the workers running?): its counts are "
            "not what the workers hold"
            for p, n in self.stale.items()
            if n
        ]
        return lines

    def closed_steps(self) -> dict[int, dict[str, Any]]:
        """Per step closed in every partition: users, reported, imputed, accepted, rejected by reason."""
        if not self.snapshots or self.missing:
            return {}
        common = set.intersection(*(set(s["history"]) for s in self.snapshots.values()))
        out = {}
        for t in sorted(common, key=int):
            parts = [s["history"][t] for s in self.snapshots.values()]
            out[int(t)] = {
                "users": sum(p["users"] for p in parts),
                "reported": sum(p["reported"] for p in parts),
                "imputed": sum(p["imputed"] for p in parts),
                "accepted": sum(p["accepted"] for p in parts),
                "rejected": _sum_reasons(p["rejected"] for p in parts),
            }
        return out

    def open_interval(self) -> dict[str, Any]:
        """Reports handled since each partition's last close: accepted and rejected by reason."""
        snaps = list(self.snapshots.values())
        return {
            "since_closed": min((s["closed"] for s in snaps), default=0),
            "accepted": sum(s["accepted"] for s in snaps),
            "rejected": _sum_reasons(s["rejected"] for s in snaps),
        }

    def as_json(self) -> dict[str, Any]:
        steps = sorted({int(t) for s in self.snapshots.values() for t in s["open"]})
        return {
            "closing_step": self.closing,
            "closed": {str(t): v for t, v in self.closed_steps().items()},
            "open": {str(t): {"reported": self.reported(t)} for t in steps if t > self.closing},
            "since_last_close": self.open_interval(),
            "partitions_without_worker_counts": self.missing,
            "unhandled_records": {str(p): n for p, n in self.unhandled.items() if n},
            "lost_reports": {str(t): n for t, n in self.lost().items()},
            "counted_past_log_end": {str(p): n for p, n in self.stale.items() if n},
            "held_uploads": self.held_uploads(),
        }


def _sum_reasons(dicts) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + int(v)
    return dict(sorted(out.items()))


def intake_view(
    store: StateStore,
    broker: str,
    reports_topic: str,
    partitions: int,
    wait: float = 10.0,
    repartition_topic: str | None = None,
    progress=None,
) -> IntakeView:
    """The partitions' intake snapshots, once each worker has caught up with the reports log and the
    ``repartition`` log (reports forwarded from other partitions; or after ``wait`` seconds:
    ``unhandled`` then says how many records each partition still has). ``progress(handled, total)``
    is called while waiting (records handled since the wait began, of those unhandled then).
    Topics the broker does not have: TopicsMissing (:mod:`pipeline.stream.kafka.topic_presence`),
    nothing created."""
    from kafka import TopicPartition

    from pipeline.stream.kafka.log_end import log_ends

    tps = [TopicPartition(reports_topic, p) for p in range(partitions)]
    forwarded = (
        [TopicPartition(repartition_topic, p) for p in range(partitions)]
        if repartition_topic
        else []
    )
    ends = log_ends(broker, tps + forwarded, must_exist=True)
    deadline = time.monotonic() + wait
    first = None
    while True:
        snaps = store.intake()
        unhandled = {
            tp.partition: max(
                0, ends[tp] - (snaps[tp.partition]["offset"] + 1 if tp.partition in snaps else 0)
            )
            for tp in tps
        }
        for (
            tp
        ) in forwarded:  # snapshots of earlier versions have no forwarded_offset: not waited for
            snap = snaps.get(tp.partition, {})
            if "forwarded_offset" in snap:
                unhandled[tp.partition] += max(0, ends[tp] - (snap["forwarded_offset"] + 1))
        stale = {
            tp.partition: snaps[tp.partition]["offset"] + 1 - ends[tp]
            for tp in tps
            if tp.partition in snaps and snaps[tp.partition]["offset"] + 1 > ends[tp]
        }
        remaining = sum(unhandled.values())
        first = remaining if first is None else first
        if progress is not None and first:
            progress(first - remaining, first)
        if not remaining and not stale or time.monotonic() > deadline:
            return IntakeView(store.last_closing(), partitions, snaps, unhandled, stale)
        time.sleep(0.2)


def open_window(deployment: Deployment, closing: int) -> range:
    """Steps the workers accept once the markers written so far are handled: closing+1 .. +max_ahead."""
    first = closing + 1
    return range(first, min(first + deployment.steps.max_ahead, deployment.horizon) + 1)


@dataclass
class StepCheck:
    step: int
    users: int
    reported: int
    imputed_share: float
    rejected: dict[str, int]
    rejected_share: float
    warnings: list[str]


def close_assessment(deployment: Deployment, view: IntakeView, steps: range) -> list[StepCheck]:
    """Each step of ``steps`` against the closed steps' median imputed and rejected shares."""
    guard = deployment.close_guard
    n = deployment.n
    history = view.closed_steps()
    base_imputed = median([h["imputed"] / h["users"] for h in history.values()]) if history else 0.0
    base_rejected = (
        median([_rejected_share(h["accepted"], h["rejected"]) for h in history.values()])
        if history
        else 0.0
    )
    interval = view.open_interval()
    checks = []
    for t in steps:
        reported = view.reported(t)
        imputed = (n - reported) / n
        # reports handled while step t was open: only the step open now has any yet
        rejected = interval["rejected"] if t == interval["since_closed"] + 1 else {}
        accepted = interval["accepted"] if t == interval["since_closed"] + 1 else 0
        rej_share = _rejected_share(accepted, rejected)
        warnings = []
        for what, share, base in (
            ("imputed", imputed, base_imputed),
            ("rejected", rej_share, base_rejected),
        ):
            if share > base + guard.warn_above:
                detail = (
                    f"{n - reported:,} of {n:,} users have no report and will be imputed"
                    if what == "imputed"
                    else f"{sum(rejected.values()):,} reports rejected {rejected}"
                )
                warnings.append(
                    f"step {t}: {what} share {share:.1%} vs {base:.1%} (median of the closed steps): {detail}"
                )
        checks.append(StepCheck(t, n, reported, imputed, rejected, rej_share, warnings))
    return checks


def _rejected_share(accepted: int, rejected: dict[str, int]) -> float:
    total = accepted + sum(rejected.values())
    return sum(rejected.values()) / total if total else 0.0
