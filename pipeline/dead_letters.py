"""``dpstream dead-letters``: what the workers rejected, summarised by reason (curator side).

The dead-letter topic holds the original reports (private) with the reason in headers
(:func:`pipeline.stream.kafka.messages.dead_letter_headers`); it is not a public topic, and this summary
is for the operator's terminal: counts by reason, the first and last source offset of each, and
(with ``--examples``) the first few details of each reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.stream.kafka.messages import REPORTS_HEADER

__all__ = ["ReasonSummary", "summarise", "format_summary"]


@dataclass
class ReasonSummary:
    count: int = 0
    first_source: str = ""
    last_source: str = ""
    examples: list[str] = field(default_factory=list)


def summarise(messages, examples: int = 0) -> dict[str, ReasonSummary]:
    """Reason -> summary, from dead-letter records (anything with ``headers`` as (key, bytes) pairs)."""
    out: dict[str, ReasonSummary] = {}
    for msg in messages:
        headers = {k: v.decode(errors="replace") for k, v in (msg.headers or [])}
        s = out.setdefault(headers.get("dpstream-reason", "(no reason header)"), ReasonSummary())
        s.count += int(headers.get(REPORTS_HEADER, "1"))  # a whole message: all its reports
        source = headers.get("dpstream-source", "")
        s.first_source = s.first_source or source
        s.last_source = source
        if len(s.examples) < examples:
            s.examples.append(headers.get("dpstream-detail", ""))
    return dict(sorted(out.items(), key=lambda kv: -kv[1].count))


def format_summary(summary: dict[str, ReasonSummary], topic: str) -> str:
    total = sum(s.count for s in summary.values())
    if not total:
        return f"{topic}: no rejected reports"
    lines = [f"{topic}: {total:,} rejected report(s)"]
    width = max(len(r) for r in summary)
    for reason, s in summary.items():
        lines.append(
            f"  {reason:<{width}}  {s.count:>9,}  (source {s.first_source} .. {s.last_source})"
        )
        lines += [f"      e.g. {e}" for e in s.examples]
    return "\n".join(lines)
