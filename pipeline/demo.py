"""``dpstream demo``: the whole system on the embedded default, end to end.

Starts the embedded broker and Redis, a releaser and ingest workers (separate processes on
the Kafka protocol), streams a simulated SIPP-like panel (n households, 12 months: a binary
poverty indicator and an occupation code with planted shifting heavy hitters) step by step, closes
each month, consumes the public topics back like a downstream analyst, and reports per step: the
release latency, the error of the debiased window counts against the truth, heavy hitters found vs
planted, and the privacy spent.

The truth columns exist only because the data is simulated: this is an evaluation, not a release.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["run_demo", "demo_config"]

HORIZON = 12
OCCUPATIONS = 4096  # public code list (hashed domain ids)


def demo_config(n: int, seed: int | None, partitions: int = 4) -> dict:
    cfg = {
        "name": "demo",
        "roster": {"size": n},
        "horizon": HORIZON,
        "topics": {"partitions": partitions},
        "steps": {"unit": "month"},
        "attributes": {
            "poverty": {
                "type": "binary",
                "label": "poor",
                "description": "household below the poverty threshold this month",
            },
            "occupation": {
                "type": "hashed",
                "size": OCCUPATIONS,
                "description": "occupation code of the reference person (public code list)",
            },
        },
        "neighbours": "replace",
        "budget": {"rho": 0.01, "epsilon": 1.0, "delta": 1e-6, "report_delta": 1e-6},
        "random": {"kind": "seeded", "seed": seed} if seed is not None else {"kind": "secure"},
        "releases": [
            {
                "name": "poverty-quarterly",
                "type": "fixed_window",
                "attribute": "poverty",
                "window": 3,
                "share": 0.5,
            },
            {
                "name": "poverty-cumulative",
                "type": "cumulative",
                "attribute": "poverty",
                "share": 0.5,
            },
            {
                "name": "occupation-heavy",
                "type": "heavy_hitters",
                "attribute": "occupation",
                "method": "tct",
                "k": 3,
                "share": 1.0,
            },
        ],
    }
    return cfg


def run_demo(args) -> int:
    from pipeline.config import load_config
    from pipeline.sim.panel import simulate_categorical_panel, simulate_poverty_panel
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = (
        (lambda *a: print(*a, file=sys.stderr, flush=True))
        if args.json
        else (lambda *a: print(*a, flush=True))
    )
    cfg = demo_config(args.n, args.seed if args.seeded else None)
    cfg_path = out / "demo.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    deployment = load_config(cfg_path)
    n = deployment.n
    poverty = simulate_poverty_panel(n=n, horizon=HORIZON, seed=args.seed)
    occupation, planted = simulate_categorical_panel(
        n,
        HORIZON,
        OCCUPATIONS,
        seed=args.seed + 1,
        persistence=0.9,
        heavy_per_phase=2,
        heavy_share=0.04,
        phase_length=3,
    )
    say(
        f"dpstream demo: n={n} households, T={HORIZON} months, releases: "
        + ", ".join(r.name for r in deployment.releases)
    )

    rows = []
    t0 = time.perf_counter()
    with LocalCluster(
        cfg_path, deployment, workers=args.workers, log_dir=out / "logs", isolated=True
    ) as cluster:
        say(
            f"embedded broker {cluster.broker}, redis {cluster.redis_url}; "
            f"{args.workers} worker(s) + releaser started (logs: {out / 'logs'})"
        )
        drv = StepDriver(
            cluster.broker,
            deployment,
            Roster.from_config(deployment.roster),
            cluster.names,
            cluster=cluster,
        )
        for t in range(1, HORIZON + 1):
            values = {"poverty": poverty[:, t - 1]}
            if "occupation" in {r.attribute for r in deployment.releases}:
                values["occupation"] = occupation[:, t - 1]
            drv.producer.send_step(t, values)
            latency = drv.close(t)
            rows.append(_step_row(deployment, drv.panels, t, latency, poverty, occupation, planted))
            say(_format_row(rows[-1], header=(t == 1)))
        drv.shutdown()
        cluster.check_alive()
    elapsed = time.perf_counter() - t0
    from pipeline.analyst.reader import PublicReader
    from pipeline.analyst.report import write_report

    reader = PublicReader(
        deployment, drv.panels
    )  # what the demo read back from the public topics, like an analyst
    report = write_report(reader, out)
    summary = {
        "n": n,
        "horizon": HORIZON,
        "workers": args.workers,
        "seconds": round(elapsed, 1),
        "secure_noise": not args.seeded,
        "steps": rows,
        "report": str(report),
        "plots": [str(p) for p in _plots(out, reader, poverty, occupation, planted)],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    say(f"done in {elapsed:.0f} s; the analyst page {report}, plots and summary.json in {out}")
    if args.json:
        print(json.dumps(summary))
    return 0


def _step_row(deployment: Deployment, panels, t, latency, poverty, occupation, planted) -> dict:
    from pipeline.queries import cumulative_counts, window_histogram

    n = poverty.shape[0]
    row = {"step": t, "latency_s": round(latency, 3)}
    fw = panels.panels.get("poverty-quarterly")
    if fw is not None and t >= 3:
        p = fw.parameters
        synth = fw.window_counts(t, debias=True)
        truth = window_histogram(poverty, t, 3, 2)
        row["window_max_err"] = round(float(np.max(np.abs(synth - truth)) / n), 5)
        row["window_bound"] = round(float(p["accuracy_bound"]) / n, 5)
    cu = panels.panels.get("poverty-cumulative")
    if cu is not None:
        synth = cu.cumulative_counts(t)
        truth = cumulative_counts(poverty)[t - 1]
        row["cumulative_max_err"] = round(float(np.max(np.abs(synth - truth)) / n), 5)
    from pipeline.releases import kind_of

    hh = [r for r in deployment.releases if kind_of(r).output == "alerts"]
    if hh:
        alert = panels.alerts.get((hh[0].name, t), {})
        found = set(alert.get("flagged", []))
        active = {h.element for h in planted if h.start <= t <= h.stop}
        row["heavy_found"] = f"{len(found & active)}/{len(active)}"
        row["heavy_false"] = len(found - active)
    spent = None
    for rel in deployment.releases:
        m = panels.panels.get(rel.name)
        if m is not None and t in m.manifests:
            spent = m.manifests[t]["privacy"].get("deployment_spent_as_approx_dp")
    if spent:
        row["epsilon_spent"] = round(spent["epsilon"], 3)
        row["delta"] = spent["delta"]
    return row


def _format_row(row: dict, header: bool) -> str:
    cols = [
        ("step", 4),
        ("latency_s", 9),
        ("window_max_err", 14),
        ("window_bound", 12),
        ("cumulative_max_err", 18),
        ("heavy_found", 11),
        ("heavy_false", 11),
        ("epsilon_spent", 13),
    ]
    line = " ".join(str(row.get(c, "-")).rjust(w) for c, w in cols)
    if header:
        return " ".join(c.rjust(w) for c, w in cols) + "\n" + line
    return line


def _save(fig, path: Path, layout: bool = True) -> Path:
    import matplotlib.pyplot as plt

    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(out: Path, reader, poverty, occupation, planted) -> list[Path]:
    """The demo's figures against the truth (simulated data only): one shared scale where panels are
    compared, the interval each release's own bound gives as a band, the privacy spend and the alerts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.queries import (
        QUARTERLY_QUANTITIES,
        cumulative_at_least,
        quarterly_masks,
        quarterly_poverty,
    )

    panels = reader.store
    n = poverty.shape[0]
    paths = []
    fw = panels.panels.get("poverty-quarterly")
    if fw is not None and fw.released_through >= 3:
        p = fw.parameters
        syn = fw.as_array()
        lam = float(p["accuracy_bound"])
        fig, axes = plt.subplots(1, 4, figsize=(16, 4.6), sharex=True, sharey=True)
        titles = {
            "at_least_1": "poor in ≥ 1 month of the quarter",
            "at_least_2": "poor in ≥ 2 months of the quarter",
            "at_least_2_consecutive": "poor in ≥ 2 consecutive months",
            "all": "poor in all 3 months",
        }
        truth = quarterly_poverty(poverty)
        raw = quarterly_poverty(syn)
        deb = quarterly_poverty(syn, n_pad=int(p["n_pad"]), n=n)
        masks = quarterly_masks(3)
        quarters = np.arange(1, len(truth["quarter_end"]) + 1)
        for ax, (name, title) in zip(axes, QUARTERLY_QUANTITIES):
            half = (
                masks[name].sum() * lam / n
            )  # a sum of |q| pattern counts, each within λ (Bun et al., Thm 3.2)
            d = deb["proportions"][name]
            ax.fill_between(
                quarters,
                np.maximum(d - half, 0),
                np.minimum(d + half, 1),
                color="tab:blue",
                alpha=0.18,
                label="interval: ± λ/n per pattern summed (Bun et al. Thm 3.2, 95% for all quarters)",
            )
            ax.plot(quarters, truth["proportions"][name], "x", ms=9, color="black", label="truth")
            ax.plot(quarters, d, "o-", color="tab:blue", ms=5, label="synthetic, padding removed")
            ax.plot(
                quarters,
                raw["proportions"][name],
                "s--",
                color="tab:orange",
                ms=4,
                label="synthetic, raw (with padding)",
            )
            ax.set_title(titles.get(name, title), fontsize=10)
            ax.set_xlabel("quarter")
            ax.set_xticks(quarters)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("share of households (one scale)")
        axes[0].set_ylim(bottom=0)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
        fig.suptitle(
            f"Quarterly poverty from the streamed fixed-window synthetic data (k = 3), one run, n = {n:,}"
        )
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        paths.append(_save(fig, out / "demo_quarterly.png", layout=False))
    cu = panels.panels.get("poverty-cumulative")
    if cu is not None and cu.released_through:
        syn = cu.as_array()
        error = reader.bounds["poverty-cumulative"].bounds["error"] / n
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        ts = np.arange(1, syn.shape[1] + 1)
        for b, color in ((1, "tab:blue"), (3, "tab:green"), (6, "tab:red")):
            est = cumulative_at_least(syn, b, n=n)[1]
            ax.fill_between(ts, np.maximum(est - error, 0), est + error, color=color, alpha=0.15)
            ax.plot(
                ts,
                cumulative_at_least(poverty[:, : syn.shape[1]], b, n=n)[1],
                "x",
                color=color,
                ms=8,
            )
            ax.plot(
                ts,
                est,
                "-",
                color=color,
                label=f"poor in at least {b} month{'s' if b > 1 else ''} so far",
            )
        ax.plot([], [], "x", color="black", label="truth")
        ax.fill_between(
            [], [], [], color="gray", alpha=0.15, label=f"interval (± {error:.2%} of n, 95%)"
        )
        ax.set_xlabel("month")
        ax.set_ylabel("share of households")
        ax.set_ylim(bottom=0)
        ax.set_xticks(ts)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Streamed cumulative synthetic data vs truth")
        paths.append(_save(fig, out / "demo_cumulative.png"))
    paths.append(_budget_plot(out, reader))
    alerts = reader.alerts()
    if alerts:
        paths.append(_alerts_plot(out, reader, alerts, planted))
    return paths


def _budget_plot(out: Path, reader) -> Path:
    import matplotlib.pyplot as plt

    from pipeline.error_bounds import planned_spend

    deployment = reader.deployment
    spend = reader.spend()
    planned = planned_spend(deployment, deployment.budget_plan().allotments())
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.plot([s["step"] for s in spend], [s["epsilon"] for s in spend], "o-", label="spent so far")
    ax.axhline(
        planned.epsilon,
        color="tab:red",
        ls="--",
        label=f"planned total over {deployment.horizon} months",
    )
    ax.set_xlabel("month")
    ax.set_ylabel(f"ε at δ = {deployment.budget.report_delta:g}")
    ax.set_xlim(0.5, deployment.horizon + 0.5)
    ax.set_ylim(0, planned.epsilon * 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Privacy spend of the whole deployment (fixed in advance, data-independent)")
    return _save(fig, out / "demo_budget.png")


def _alerts_plot(out: Path, reader, alerts, planted) -> Path:
    """Flagged occupation codes per month against the planted heavy hitters (simulation truth)."""
    import matplotlib.pyplot as plt

    codes = sorted(
        {int(x) for a in alerts for x in a.get("flagged", [])} | {h.element for h in planted}
    )
    row = {c: i for i, c in enumerate(codes)}
    fig, ax = plt.subplots(figsize=(7.5, 1.9 + 0.32 * len(codes)))
    for h in planted:
        ax.barh(
            row[h.element],
            h.stop - h.start + 1,
            left=h.start - 0.5,
            height=0.6,
            color="tab:gray",
            alpha=0.3,
        )
    xs = [a["step"] for a in alerts for _ in a.get("flagged", [])]
    ys = [row[int(x)] for a in alerts for x in a.get("flagged", [])]
    from matplotlib.patches import Patch

    ax.plot(xs, ys, "o", color="tab:red", label="flagged (alerts topic)")
    handles = [
        ax.get_lines()[-1],
        Patch(
            color="tab:gray",
            alpha=0.3,
            label="planted: held by 4% of households (simulation truth)",
        ),
    ]
    ax.set_yticks(range(len(codes)))
    ax.set_yticklabels([f"occupation {c}" for c in codes])
    ax.set_xlabel("month")
    ax.set_xlim(0.5, reader.deployment.horizon + 0.5)
    ax.set_xticks(range(1, reader.deployment.horizon + 1))
    ax.legend(
        handles=handles,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncol=2,
        frameon=False,
    )
    k = next(
        (
            getattr(r, "k", None)
            for r in reader.deployment.releases
            if r.name == alerts[0]["release"]
        ),
        None,
    )
    ax.set_title(f"Heavy-hitter alerts; a household stops counting after k = {k} flags")
    return _save(fig, out / "demo_alerts.png")
