"""``dpstream status``: what the deployment's state holds, as a document (``--json``) and as text.

Everything here is curator-side (the operator's terminal): the ledger, the released and closed
steps, and the workers' own per-step counts — read from the intake snapshots they write from their
state (restored from their checkpoints on every assignment), not from what was sent. A lost log
(reports counted on a log the broker no longer holds) is flagged, never folded into the counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.stream.state.store import StateStore

__all__ = ["status_document", "format_status"]


def status_document(
    deployment: Deployment, store: StateStore, intake: dict[str, Any], source: str
) -> dict[str, Any]:
    """The status of ``deployment`` from its Redis ``store``; ``intake`` is ``IntakeView.as_json()`` (or says why
    it is unavailable) and ``source`` where the state was read."""
    from pipeline.error_bounds import spend_as_approx_dp
    from pipeline.privacy.ledger import LedgerEntry

    ledger = store.ledger()
    identity = store.identity() or {}
    spent = spend_as_approx_dp(
        deployment, [LedgerEntry.from_state(e).cost for e in ledger.values()]
    )
    planned = deployment.budget.total_epsilon()
    return {
        "deployment": deployment.name,
        "source": source,
        "instance": identity.get("instance"),
        "fingerprint": identity.get("fingerprint"),
        "released_step": store.last_released(),
        "published_step": store.last_published(),
        "closing_step": store.last_closing(),
        "horizon": deployment.horizon,
        "plan": {k: v.__dict__ for k, v in deployment.budget_plan().allotments().items()},
        "budget_epsilon_at_report_delta": planned,
        "ledger": ledger,
        "spent_as_approx_dp": {
            "epsilon": spent.epsilon,
            "delta": spent.delta,
        },  # as the manifests report it
        "intake": intake,
    }


def _steps(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}..{last}"


def format_status(s: dict[str, Any]) -> str:
    """The status document as text for an operator who has not read the code."""
    lines = [
        f"deployment {s['deployment']} (instance {s['instance'] or 'not created yet'}); state read from "
        f"{s['source']}",
        f"released through step {s['released_step']} of {s['horizon']} (published through "
        f"{s['published_step']}); close markers written through step {s['closing_step']}",
    ]
    if s["closing_step"] > s["released_step"]:
        lines.append(
            f"  {_steps(s['released_step'] + 1, s['closing_step'])} closed, not released yet: the "
            "releaser gathers their partials; it writes their markers again when it starts, in case the "
            "broker lost them (docs/streaming.md, 'A lost close')"
        )
    spent = s["spent_as_approx_dp"]
    lines.append(
        f"spent so far: (ε, δ) = ({spent['epsilon']:.6g}, {spent['delta']:.3g}) in {len(s['ledger'])} "
        f"ledger entries; whole budget: ε = {s['budget_epsilon_at_report_delta']:.6g} at report_delta"
    )
    intake = s["intake"]
    if "unavailable" in intake:
        lines.append(f"workers' counts unavailable: {intake['unavailable']}")
        return "\n".join(lines)
    lines.append(
        "what the workers hold (their checkpointed state; curator-side counts, never published):"
    )
    for t, c in intake.get("closed", {}).items():
        rejected = sum(c["rejected"].values())
        lines.append(
            f"  step {t} closed: {c['reported']:,} of {c['users']:,} users reported, {c['imputed']:,} "
            f"imputed; {rejected:,} reports rejected" + (f" {c['rejected']}" if rejected else "")
        )
    for t, c in intake.get("open", {}).items():
        lines.append(f"  step {t} open: {c['reported']:,} users reported so far")
    if intake.get("partitions_without_worker_counts"):
        lines.append(
            f"  no counts yet from reports partition(s) {intake['partitions_without_worker_counts']}"
        )
    for p, n in intake.get("unhandled_records", {}).items():
        lines.append(f"  reports partition {p}: {n:,} records not handled yet")
    for upload, h in intake.get("held_uploads", {}).items():
        lines.append(
            f"  upload {upload}: {h['messages']:,} message(s) held, not committed yet (they count only "
            "once its produce commits them; never committed, they are dead-lettered as uncommitted "
            + ("at the next close)" if h["closes"] else "at the second close from now)")
        )
    for t, n in intake.get("lost_reports", {}).items():
        lines.append(
            f"LOST: step {t}: {n:,} reports the workers had counted were lost with the broker's log; they "
            f"are not in the workers' state: send them again (dpstream produce --step {t}) before closing"
        )
    for p, n in intake.get("counted_past_log_end", {}).items():
        lines.append(
            f"LOST: reports partition {p}: the counts cover {n:,} records past the end of its log: the "
            "broker lost it and no worker has restored the partition since (are the workers running?)"
        )
    return "\n".join(lines)
