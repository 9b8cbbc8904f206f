"""``dpstream report``: one self-contained HTML page of a deployment's public outputs.

Built from the public topics alone (:class:`~pipeline.analyst.reader.PublicReader`): per release its
series over the released steps with public labels, as shares of n with the interval the mechanism's
own bound gives at the release's β (debiased: the padding removed), and a table of every released
step; the privacy spend over time as ε at the report δ against the planned total; and the alerts as
a timeline with what a flag means and why flags run out.

Plots are plotly figures (plotly.js inlined once in the page, so it opens with no network; docs
explain the choice). Every plotted number is also in a table beside its plot, so the page reads
without JavaScript and a test can read the numbers back from the DOM.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.releases import kind_of

if TYPE_CHECKING:
    from pipeline.releases import ReleaseConfig

__all__ = ["write_report", "render_report"]

_COLOURS = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta { color: #555; } .note { color: #444; font-size: 0.95em; } .bound { background: #f4f7fb; padding: 0.5em 0.8em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0 1.2em; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 0.25em 0.7em; text-align: right; }
th:first-child, td:first-child { text-align: left; } .neg { color: #b00; }
table.alerts td, table.alerts th { text-align: left; }
"""


def _e(text) -> str:
    return html.escape(str(text))


def _plot_text(text) -> str:
    """Configuration text for a plotly label: plotly renders a subset of HTML in legends, titles,
    ticks and
    hover labels (``<a href>`` becomes a live link) and decodes entities, so escaping shows the
    text as typed."""
    return html.escape(str(text), quote=False)


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _figure_html(fig) -> str:
    return fig.to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True}
    )


def _dominant(answer):
    """The row whose share is more than twice every other's (e.g. "poor in none of the 3 months"), or None:
    drawn, it flattens every other series into the bottom of the plot."""
    rows = sorted(answer.rows, key=lambda r: r.estimate, reverse=True)
    if len(rows) > 2 and rows[0].estimate > 2 * max(rows[1].estimate, 1):
        return rows[0]
    return None


def _series_figure(answers, title: str, unit: str, hidden=None):
    """Each row label's share of n over the steps, with its interval as a band; one y scale. ``hidden``:
    a row shown only in the legend (click to draw it)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    keys = [(r.key, _plot_text(r.series or r.label)) for r in answers[-1].rows]
    steps = [a.step for a in answers]
    for i, (key, label) in enumerate(keys):
        colour = _COLOURS[i % len(_COLOURS)]
        found = [next((r for r in a.rows if r.key == key), None) for a in answers]
        xs = [t for t, r in zip(steps, found) if r is not None]
        rows = [r for r in found if r is not None]
        est = [100 * r.share(r.estimate) for r in rows]
        visible = "legendonly" if hidden is not None and key == hidden.key else True
        if rows and rows[0].low is not None:
            hi = [100 * r.share(r.high) for r in rows]
            lo = [100 * r.share(r.low) for r in rows]
            fig.add_trace(
                go.Scatter(
                    x=xs + xs[::-1],
                    y=hi + lo[::-1],
                    fill="toself",
                    fillcolor=colour,
                    opacity=0.15,
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=label,
                    visible=visible,
                )
            )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=est,
                mode="lines+markers",
                name=label,
                legendgroup=label,
                visible=visible,
                line={"color": colour},
                hovertemplate="%{y:.2f}% at " + _plot_text(unit) + " %{x}",
            )
        )
    fig.update_layout(
        title=_plot_text(title),
        height=420,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        template="plotly_white",
        legend={"font": {"size": 11}},
    )
    fig.update_xaxes(title=_plot_text(unit), dtick=1)
    fig.update_yaxes(title="share of n (%), band: interval", ticksuffix="%")
    return fig


_NEGATIVE = (
    "A negative estimate (red) is noise around a small true count. The count itself cannot be negative, so "
    "its interval is clipped at 0 and does not contain the estimate; the estimate is left unclipped because "
    "clipping every estimate at 0 would bias every sum of them upward."
)


def _answer_table(answer) -> str:
    rows = []
    for r in answer.rows:
        neg = ' class="neg"' if r.estimate < 0 else ""
        clipped = " (clipped at 0, see below)" if r.low is not None and r.estimate < r.low else ""
        rows.append(
            f"<tr><td>{_e(r.label)}</td><td{neg}>{_num(r.estimate)}</td>"
            f"<td>[{_num(r.low)}, {_num(r.high)}]{clipped}</td><td>{100 * r.share(r.estimate):.2f}%</td>"
            f"<td>[{100 * r.share(r.low):.2f}%, {100 * r.share(r.high):.2f}%]</td></tr>"
        )
    note = (
        f'<p class="note">{_e(_NEGATIVE)}</p>' if any(r.estimate < 0 for r in answer.rows) else ""
    )
    return (
        '<table class="answer"><tr><th>label</th><th>estimate (users)</th><th>interval</th><th>share of n</th>'
        "<th>share interval</th></tr>" + "".join(rows) + "</table>" + note
    )


def _answer_tables(answers, unit: str) -> str:
    """The latest step's table, then every earlier step's (folded: one click opens them)."""
    last, earlier = answers[-1], answers[-2::-1]
    html_ = f"<h3>{_e(unit)} {last.step} (latest)</h3>" + _answer_table(last)
    if earlier:
        html_ += (
            f'<details class="earlier"><summary>earlier {_e(unit)}s ({len(earlier)})</summary>'
            + "".join(f"<h3>{_e(unit)} {a.step}</h3>" + _answer_table(a) for a in earlier)
            + "</details>"
        )
    return html_


def _release_section(reader, rel: ReleaseConfig) -> str:
    kind = kind_of(rel)
    answers_q, not_answered = kind.questions(rel, reader.deployment.steps.unit)
    unit = reader.deployment.steps.unit
    parts = [
        f'<h2 id="{_e(rel.name)}">{_e(rel.name)}</h2>',
        f'<p class="meta">{_e(rel.type)} release of <b>{_e(rel.attribute)}</b>'
        f"{': ' + _e(reader.deployment.attributes[rel.attribute].description) if reader.deployment.attributes[rel.attribute].description else ''}</p>",
        f"<p><b>Answers:</b> {_e('; '.join(answers_q))}.<br><b>Does not answer:</b> {_e('; '.join(not_answered))}.</p>",
        f'<p class="bound">{_e(reader.explain(rel)[0].upper() + reader.explain(rel)[1:])}.</p>',
    ]
    if reader.released_through(rel) < kind.first_step(rel):
        return "".join(parts) + "<p>Nothing released yet.</p>"
    from .reader import AnalystError

    try:
        answers = reader.series(rel.name)
    except (
        AnalystError
    ) as err:  # e.g. a query family with no default set of rows (dyadic ranges, single values)
        return "".join(parts) + (
            f'<p class="note">No default series to draw: {_e(err)}; `dpstream query '
            f"--release {_e(rel.name)} --group ...` answers one query.</p>"
        )
    last = answers[-1]
    hidden = _dominant(last)
    parts.append(
        _figure_html(
            _series_figure(
                answers, f"{rel.name}: {last.question.split(' ending at')[0]}", unit, hidden
            )
        )
    )
    if hidden is not None:
        parts.append(
            f'<p class="note">Not drawn, to keep the others readable: “{_e(hidden.series or hidden.label)}” '
            f"({100 * hidden.share(hidden.estimate):.1f}% of n at {_e(unit)} {last.step}); click it in the "
            "legend to draw it.</p>"
        )
    parts.append(f'<p class="note">Interval: {_e(last.bound)}.</p>')
    parts += [
        f'<p class="note">{_e(n[0].upper() + n[1:])}.</p>'
        for n in last.notes
        if not n.startswith("this release does not answer")
    ]  # said above, with what it answers
    parts.append(_answer_tables(answers, unit))
    return "".join(parts)


def _spend_section(reader) -> str:
    import plotly.graph_objects as go

    from pipeline.error_bounds import planned_spend

    deployment = reader.deployment
    spend = reader.spend()
    planned = planned_spend(deployment, deployment.budget_plan().allotments())
    delta = deployment.budget.report_delta
    parts = [
        '<h2 id="privacy">Privacy spend</h2>',
        f"<p>The whole deployment's spend after each released {_e(deployment.steps.unit)}, as one (ε, δ) at the report "
        f"δ = {delta:g} (zCDP converted, plus the monitors' (ε, δ)), against the planned total over the horizon "
        f"ε = {planned.epsilon:.4g} (δ = {planned.delta:.3g}). The spend is fixed in advance: it does not depend "
        "on the data.</p>",
    ]
    if not spend:
        return "".join(parts) + "<p>Nothing released yet.</p>"
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[s["step"] for s in spend],
            y=[s["epsilon"] for s in spend],
            mode="lines+markers",
            name="ε spent",
            line={"color": _COLOURS[0]},
        )
    )
    fig.add_hline(
        y=planned.epsilon,
        line={"dash": "dash", "color": "#b00"},
        annotation_text=f"planned total ε = {planned.epsilon:.3g}",
        annotation_position="bottom right",
    )
    fig.update_layout(
        title=f"ε spent at δ = {delta:g}",
        height=340,
        template="plotly_white",
        showlegend=False,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    fig.update_xaxes(
        title=_plot_text(deployment.steps.unit), dtick=1, range=[0.5, deployment.horizon + 0.5]
    )
    fig.update_yaxes(title="ε", rangemode="tozero")
    parts.append(_figure_html(fig))
    rows = "".join(
        f"<tr><td>{s['step']}</td><td>{s['epsilon']:.4f}</td><td>{s['delta']:.3g}</td>"
        f"<td>{100 * s['epsilon'] / planned.epsilon:.1f}%</td></tr>"
        for s in spend
    )
    parts.append(
        '<table class="spend"><tr><th>'
        + _e(deployment.steps.unit)
        + "</th><th>ε spent</th><th>δ</th>"
        "<th>of planned ε</th></tr>" + rows + "</table>"
    )
    return "".join(parts)


def _alerts_section(reader) -> str:
    import plotly.graph_objects as go

    rels = [r for r in reader.deployment.releases if kind_of(r).output == "alerts"]
    if not rels:
        return ""
    parts = ['<h2 id="alerts">Alerts</h2>']
    for rel in rels:
        kind = kind_of(rel)
        alerts = reader.alerts(rel.name)
        parts.append(f"<h3>{_e(rel.name)} ({_e(rel.type)})</h3>")
        parts.append(f'<p class="bound">What a flag means: {_e(reader.explain(rel))}.</p>')
        if kind.flag_limit(rel):
            parts.append(f'<p class="note">Why flags run out: {_e(kind.flag_limit(rel))}.</p>')
        points = [
            (a["step"], _plot_text(name), a)
            for a in alerts
            for name in _alert_items(kind, rel, reader, a)
        ]
        unit = _plot_text(reader.deployment.steps.unit)
        if points:
            fig = go.Figure(
                go.Scatter(
                    x=[p[0] for p in points],
                    y=[p[1] for p in points],
                    mode="markers",
                    marker={"size": 12, "color": _COLOURS[1]},
                    name="flagged",
                    hovertemplate="%{y} at " + unit + " %{x}<extra></extra>",
                )
            )
            fig.update_layout(
                title=f"{_plot_text(rel.name)}: what was flagged at each {unit}",
                height=200 + 28 * len({p[1] for p in points}),
                template="plotly_white",
                margin={"l": 160, "r": 20, "t": 50, "b": 50},
            )
            fig.update_xaxes(title=unit, dtick=1, range=[0.5, reader.deployment.horizon + 0.5])
            parts.append(_figure_html(fig))
        rows = "".join(f"<tr><td>{a['step']}</td><td>{_e(a['text'])}</td></tr>" for a in alerts)
        parts.append(
            '<table class="alerts"><tr><th>'
            + _e(reader.deployment.steps.unit)
            + "</th><th>alert</th></tr>"
            + (rows or "<tr><td colspan=2>no alerts yet</td></tr>")
            + "</table>"
        )
    return "".join(parts)


def _alert_items(kind, rel: ReleaseConfig, reader, alert) -> list[str]:
    """The labels a timeline shows for one alert: the flagged values, or the band answer."""
    from pipeline.releases.reading import code_labels

    if "flagged" in alert:
        return code_labels(reader.deployment.attributes[rel.attribute], alert["flagged"])
    return [alert["text"]] if alert.get("answer") not in (None, "between") else []


def render_report(reader) -> str:
    """The page as one HTML string (plotly.js inlined)."""
    from plotly.offline import get_plotlyjs

    deployment = reader.deployment
    counts = [r for r in deployment.releases if kind_of(r).output != "alerts"]
    through = max((reader.released_through(r) for r in deployment.releases), default=0)
    toc = " · ".join(f'<a href="#{_e(r.name)}">{_e(r.name)}</a>' for r in counts)
    body = [
        f"<h1>dpstream report: {_e(deployment.name)}</h1>",
        f'<p class="meta">n = {deployment.n:,} users, horizon {deployment.horizon} {_e(deployment.steps.unit)}s, released through '
        f"{_e(deployment.steps.unit)} {through}. Built from the public topics only (releases, synthetic, alerts, deployment): every "
        "number here is differentially private output or public configuration.</p>",
        f'<p>{toc} · <a href="#privacy">privacy spend</a>'
        + (' · <a href="#alerts">alerts</a>' if len(counts) < len(deployment.releases) else "")
        + "</p>",
    ]
    body += [_release_section(reader, r) for r in counts]
    body.append(_spend_section(reader))
    body.append(_alerts_section(reader))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>dpstream report: {_e(deployment.name)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        + "".join(body)
        + "</body></html>"
    )


def write_report(reader, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.html"
    path.write_text(render_report(reader), encoding="utf-8")
    return path
