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

import numpy as np
import yaml

__all__ = ["run_demo", "demo_config"]

HORIZON = 12
OCCUPATIONS = 4096  # public code list (hashed domain ids)


def demo_config(n: int, seed: int | None, partitions: int = 4) -> dict:
    cfg = {
        "name": "demo",
        "roster": {"size": n},
        "horizon": HORIZON,
        "topics": {"partitions": partitions},
        "attributes": {
            "poverty": {"type": "binary", "description": "household below the poverty threshold this month"},
            "occupation": {"type": "hashed", "size": OCCUPATIONS,
                           "description": "occupation code of the reference person (public code list)"},
        },
        "neighbours": "replace",
        "budget": {"rho": 0.01, "epsilon": 1.0, "delta": 1e-6, "report_delta": 1e-6},
        "random": {"kind": "seeded", "seed": seed} if seed is not None else {"kind": "secure"},
        "releases": [
            {"name": "poverty-quarterly", "type": "fixed_window", "attribute": "poverty", "window": 3, "share": 0.5},
            {"name": "poverty-cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5},
            {"name": "occupation-heavy", "type": "heavy_hitters", "attribute": "occupation", "method": "tct",
             "k": 3, "share": 1.0},
        ],
    }
    return cfg


def run_demo(args) -> int:
    from pipeline.config import load_config
    from pipeline.sim.panel import simulate_categorical_panel, simulate_poverty_panel
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.ingest.roster import Roster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    cfg = demo_config(args.n, args.seed if args.seeded else None)
    cfg_path = out / "demo.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    dep = load_config(cfg_path)
    n = dep.n
    poverty = simulate_poverty_panel(n=n, horizon=HORIZON, seed=args.seed)
    occupation, planted = simulate_categorical_panel(
        n, HORIZON, OCCUPATIONS, seed=args.seed + 1, persistence=0.9, heavy_per_phase=2, heavy_share=0.04,
        phase_length=3)
    say(f"dpstream demo: n={n} households, T={HORIZON} months, releases: "
        + ", ".join(r.name for r in dep.releases))

    rows = []
    t0 = time.perf_counter()
    with LocalCluster(cfg_path, dep, workers=args.workers, log_dir=out / "logs") as cluster:
        say(f"embedded broker {cluster.broker}, redis {cluster.redis_url}; "
            f"{args.workers} worker(s) + releaser started (logs: {out / 'logs'})")
        drv = StepDriver(cluster.broker, dep, Roster.from_config(dep.roster), cluster.names, cluster=cluster)
        for t in range(1, HORIZON + 1):
            values = {"poverty": poverty[:, t - 1]}
            if "occupation" in {r.attribute for r in dep.releases}:
                values["occupation"] = occupation[:, t - 1]
            drv.producer.send_step(t, values)
            latency = drv.close(t)
            rows.append(_step_row(dep, drv.panels, t, latency, poverty, occupation, planted))
            say(_format_row(rows[-1], header=(t == 1)))
        drv.shutdown()
        cluster.check_alive()
    elapsed = time.perf_counter() - t0
    summary = {"n": n, "horizon": HORIZON, "workers": args.workers, "seconds": round(elapsed, 1),
               "secure_noise": not args.seeded, "steps": rows,
               "plots": [str(p) for p in _plots(out, dep, drv.panels, poverty)]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    say(f"done in {elapsed:.0f} s; plots and summary.json in {out}")
    if args.json:
        print(json.dumps(summary))
    return 0


def _step_row(dep, panels, t, latency, poverty, occupation, planted) -> dict:
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
    hh = [r for r in dep.releases if r.type == "heavy_hitters"]
    if hh:
        alert = panels.alerts.get((hh[0].name, t), {})
        found = set(alert.get("flagged", []))
        active = {h.element for h in planted if h.start <= t <= h.stop}
        row["heavy_found"] = f"{len(found & active)}/{len(active)}"
        row["heavy_false"] = len(found - active)
    spent = None
    for rel in dep.releases:
        m = panels.panels.get(rel.name)
        if m is not None and t in m.manifests:
            spent = m.manifests[t]["privacy"].get("deployment_spent_as_approx_dp")
    if spent:
        row["epsilon_spent"] = round(spent["epsilon"], 3)
        row["delta"] = spent["delta"]
    return row


def _format_row(row: dict, header: bool) -> str:
    cols = [("step", 4), ("latency_s", 9), ("window_max_err", 14), ("window_bound", 12), ("cumulative_max_err", 18),
            ("heavy_found", 11), ("heavy_false", 11), ("epsilon_spent", 13)]
    line = " ".join(str(row.get(c, "-")).rjust(w) for c, w in cols)
    if header:
        return " ".join(c.rjust(w) for c, w in cols) + "\n" + line
    return line


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(out: Path, dep, panels, poverty) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.queries import cumulative_at_least, quarterly_poverty

    paths = []
    fw = panels.panels.get("poverty-quarterly")
    if fw is not None:
        p = fw.parameters
        syn = fw.as_array()
        n = poverty.shape[0]
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), sharex=True)
        truth = quarterly_poverty(poverty)
        raw = quarterly_poverty(syn)
        deb = quarterly_poverty(syn, n_pad=int(p["n_pad"]), n=n)
        quarters = np.arange(1, len(truth["quarter_end"]) + 1)
        for ax, name in zip(axes, truth["proportions"]):
            ax.scatter(quarters, truth["proportions"][name], marker="x", s=60, color="black", label="truth")
            ax.scatter(quarters, deb["proportions"][name], color="tab:blue", s=18, label="synthetic, debiased")
            ax.scatter(quarters, raw["proportions"][name], color="tab:orange", s=18, label="synthetic, raw")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("quarter")
            ax.set_xticks(quarters)
        axes[0].set_ylabel("share of households")
        axes[0].legend(fontsize=7)
        fig.suptitle("Streamed fixed-window synthetic data (k=3) vs truth, one run")
        paths.append(_save(fig, out / "demo_quarterly.png"))
    cu = panels.panels.get("poverty-cumulative")
    if cu is not None:
        syn = cu.as_array()
        n = poverty.shape[0]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ts = np.arange(1, HORIZON + 1)
        for b, color in ((1, "tab:blue"), (3, "tab:green"), (6, "tab:red")):
            ax.plot(ts, cumulative_at_least(poverty, b, n=n)[1], "x", color=color, label=f"truth, b={b}")
            ax.plot(ts, cumulative_at_least(syn, b, n=n)[1], "-", color=color, label=f"synthetic, b={b}")
        ax.set_xlabel("month t")
        ax.set_ylabel("share with ≥ b months in poverty up to t")
        ax.legend(fontsize=7)
        ax.set_title("Streamed cumulative synthetic data vs truth")
        paths.append(_save(fig, out / "demo_cumulative.png"))
    return paths
