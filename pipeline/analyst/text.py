"""Answers, alerts and plans as text for a terminal (the commands' default output; ``--json`` for machines)."""

from __future__ import annotations

__all__ = ["format_answer", "format_alerts", "alert_line"]


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def format_answer(answer) -> str:
    """A labelled table: label, estimate, interval, share of n with its interval; then the bound and notes."""
    lines = [f"{answer.release} ({answer.type}), {answer.question}:"]
    width = max((len(r.label) for r in answer.rows), default=5)
    for r in answer.rows:
        line = f"  {r.label:<{width}}  {_num(r.estimate):>9}"
        if r.low is not None:
            line += f"  [{_num(r.low)}, {_num(r.high)}]"
        if r.n:
            line += f"  {r.share(r.estimate):7.2%} of n"
            if r.low is not None:
                line += f" [{r.share(r.low):.2%}, {r.share(r.high):.2%}]"
        if r.estimate < 0:
            line += "  (negative: noise; see clipping below)"
        lines.append(line)
    if answer.bound:
        lines.append(f"interval: {answer.bound}")
    lines += [f"note: {n}" for n in answer.notes]
    return "\n".join(lines)


def alert_line(alert: dict) -> str:
    return f"step {alert['step']:>3}  {alert['release']}: {alert['text']}"


def format_alerts(alerts: list[dict], explain: dict[str, list[str]]) -> str:
    """The alerts by step, then per release what a flag means and when flags run out."""
    lines = [alert_line(a) for a in alerts]
    if not alerts:
        lines.append("no alerts published yet")
    for release, text in explain.items():
        lines.append("")
        lines.append(f"{release}:")
        lines += [f"  {t}" for t in text]
    return "\n".join(lines)
