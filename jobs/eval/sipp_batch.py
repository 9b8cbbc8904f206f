"""Batch evaluation on a SIPP-like panel: Bun et al. 2024 (continual synthetic data), Section 5
(Figures 1-2) and Appendix C (Figure 3).

    python -m jobs.eval.sipp_batch [--runs 200] [--seed 0] [--out out/sipp_batch] [--quick] [--secure]

Simulates a monthly poverty panel (n = 23,374 households, T = 12 months; see
:func:`pipeline.sim.simulate_poverty_panel`), then runs the fixed-window synthesizer
(Algorithm 1, window k = 3) and the cumulative synthesizer (Algorithm 2) at ρ = 0.005 each,
R times, and reports how the synthetic data answers

* the four quarterly poverty quantities (≥1, ≥2, ≥2 consecutive, all 3 months of a quarter),
  raw (proportion on the synthetic records, count / m) and debiased (padding n_pad·|q|
  subtracted, divided by n; see :mod:`pipeline.queries`) — Figure 1;
* the cumulative "≥ 3 months in poverty up to month t" for every t — Figure 2;
* the fixed-window error max_s |p_s^t − n_pad − C_s^t| / n per step against the Theorem 3.2
  bound — Figure 3 (and its raw, non-debiased counterpart, Figure 4);
* the cumulative synthesizer's max error over all (t, b), max |Ŝ_b^t − S_b^t| / n, with each
  continual counter ("tree": the paper's binary tree; "factorization": the square-root
  factorization, the default), run on the same panel and seeds — the counters comparison.

Randomness: run i seeds one :class:`~pipeline.privacy.rng.SeededRandom` with ``seed + i`` and
shares it between the two synthesizers (they draw in turn, so their noise is independent).
Seeded sources are reproducible and NOT cryptographically secure: simulation only. ``--secure``
uses the operating system CSPRNG instead (not reproducible).

This is an evaluation on simulated data: its outputs put true values next to synthetic ones on
purpose and are not a release. Never point it at real reports and publish the result.

Outputs in ``--out``: ``fig1_quarterly.png``, ``fig2_cumulative.png``, ``fig3_window_error.png``,
``summary.json``; a table of the same numbers is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import queries as Q
from pipeline.privacy.rng import SecureRandom, SeededRandom
from pipeline.sim import simulate_poverty_panel

N_HOUSEHOLDS = 23374
HORIZON = 12
WINDOW = 3
RHO = 0.005
BETA = 0.05
CUMULATIVE_B = 3
DEFAULT_RUNS = 200
QUICK_RUNS = 40
DATA_SEED = 2021
NEIGHBOURS = "add_remove"
CUMULATIVE_COUNTERS = ("tree", "factorization")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jobs.eval.sipp_batch", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help=f"repetitions (default {DEFAULT_RUNS}; {QUICK_RUNS} with --quick)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed base: run i uses seed+i (simulation only, not secure)",
    )
    p.add_argument(
        "--secure", action="store_true", help="draw noise from the OS CSPRNG instead of seeds"
    )
    p.add_argument("--out", type=Path, default=Path("out/sipp_batch"), help="output directory")
    p.add_argument("--quick", action="store_true", help=f"fast run ({QUICK_RUNS} repetitions)")
    p.add_argument(
        "--rho", type=float, default=RHO, help="zCDP budget of each synthesizer (default 0.005)"
    )
    p.add_argument("--data-seed", type=int, default=DATA_SEED, help="seed of the simulated panel")
    p.add_argument("--n", type=int, default=N_HOUSEHOLDS, help="households in the simulated panel")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = p.parse_args(argv)
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else DEFAULT_RUNS
    if args.runs < 2:
        p.error(
            f"--runs must be at least 2 (got {args.runs}): the summary reports spreads over runs"
        )
    if not args.rho > 0:
        p.error(f"--rho must be positive (got {args.rho})")
    if args.n < 1:
        p.error(f"--n must be positive (got {args.n})")
    return args


def theorem_3_2_bound(
    n: int, horizon: int, k: int, rho: float, beta: float, categories: int = 2
) -> float:
    """Theorem 3.2 (add/remove neighbours): w.p. ≥ 1 − β, max_{s,t} |p_s^t − C_s^t − n_pad| ≤ this · n."""
    r = horizon - k + 1
    lam = (math.sqrt(r / rho) + 1 / math.sqrt(2)) * math.sqrt(math.log(categories**k * r / beta))
    return lam / n


def bin_noise_sd(horizon: int, k: int, rho: float) -> float:
    """σ of the discrete Gaussian added to each window-pattern bin: σ² = (T − k + 1) / (2ρ)."""
    return math.sqrt((horizon - k + 1) / (2 * rho))


def _synthesizers():
    # Imported here so that a missing synthesizer fails the job with a clear message, not the import of this module.
    from pipeline.synth.cumulative import CumulativeSynthesizer
    from pipeline.synth.fixed_window import FixedWindowSynthesizer

    return FixedWindowSynthesizer, CumulativeSynthesizer


def run_experiment(
    panel: np.ndarray, *, runs: int, seed: int, secure: bool, rho: float, progress: bool = True
) -> dict:
    """Run both synthesizers ``runs`` times on ``panel``; return per-run answers as arrays."""
    from tqdm import tqdm

    FixedWindow, Cumulative = _synthesizers()
    from pipeline.counters import resolve_counter
    from pipeline.synth.cumulative import DEFAULT_COUNTER

    n, horizon = panel.shape
    columns = [np.ascontiguousarray(panel[:, t], dtype=np.int64) for t in range(horizon)]
    true_hists = Q.window_histograms(panel, WINDOW)  # (T-k+1, 2^k)
    names = [name for name, _ in Q.QUARTERLY_QUANTITIES]
    quarters = horizon // WINDOW

    raw = {name: np.empty((runs, quarters)) for name in names}
    deb = {name: np.empty((runs, quarters)) for name in names}
    cum = {c: np.empty((runs, horizon, horizon + 1)) for c in CUMULATIVE_COUNTERS}
    cum_max_sd = {}
    err_deb = np.empty((runs, horizon - WINDOW + 1))
    err_raw = np.empty((runs, horizon - WINDOW + 1))
    n_pads = np.empty(runs, dtype=np.int64)
    ms = np.empty(runs, dtype=np.int64)
    clamps = np.empty(runs, dtype=np.int64)

    t0 = time.perf_counter()
    for i in tqdm(range(runs), desc="synthesizer runs", unit="run", disable=not progress):
        source = SecureRandom() if secure else SeededRandom(seed + i)
        fw = FixedWindow(
            horizon=horizon,
            window=WINDOW,
            rho=rho,
            beta=BETA,
            categories=2,
            neighbours=NEIGHBOURS,
            seed=source,
        )
        cus = {
            c: Cumulative(
                horizon=horizon, rho=rho, beta=BETA, neighbours=NEIGHBOURS, seed=source, counter=c
            )
            for c in CUMULATIVE_COUNTERS
        }
        for col in columns:
            fw.update(col)
            for cu in cus.values():
                cu.update(col)
        synth = np.asarray(fw.synthetic)
        n_pads[i], ms[i], clamps[i] = fw.n_pad, synth.shape[0], fw.clamp_count
        q_raw = Q.quarterly_poverty(synth)
        q_deb = Q.quarterly_poverty(synth, n_pad=int(fw.n_pad), n=n)
        for name in names:
            raw[name][i] = q_raw["proportions"][name]
            deb[name][i] = q_deb["proportions"][name]
        for c, cu in cus.items():
            cum[c][i] = Q.cumulative_counts(np.asarray(cu.synthetic)) / n
            if i == 0:  # the counters' largest error sd over (b, t), from their variances
                cum_max_sd[c] = (
                    max(
                        math.sqrt(cu.counter_variance(b, t))
                        for b in range(1, horizon + 1)
                        for t in range(b, horizon + 1)
                    )
                    / n
                )
        synth_hists = Q.window_histograms(synth, WINDOW)
        err_deb[i] = np.abs(synth_hists - fw.n_pad - true_hists).max(axis=1) / n
        err_raw[i] = np.abs(synth_hists / synth.shape[0] - true_hists / n).max(axis=1)
    elapsed = time.perf_counter() - t0
    return {
        "raw": raw,
        "debiased": deb,
        "cumulative": cum[resolve_counter(DEFAULT_COUNTER, horizon)],
        "cumulative_by_counter": cum,
        "cumulative_max_sd": cum_max_sd,
        "err_debiased": err_deb,
        "err_raw": err_raw,
        "n_pad": n_pads,
        "m": ms,
        "clamps": clamps,
        "seconds": elapsed,
    }


def summarise(panel: np.ndarray, res: dict, args: argparse.Namespace) -> dict:
    n, horizon = panel.shape
    runs = args.runs
    truth_q = Q.quarterly_poverty(panel, k=WINDOW)
    masks = Q.quarterly_masks(WINDOW)
    truth_cum = Q.cumulative_counts(panel) / n
    m_mean = float(res["m"].mean())
    n_pad = int(res["n_pad"][0])
    sigma = bin_noise_sd(horizon, WINDOW, args.rho)
    quarterly = {}
    for name, _label in Q.QUARTERLY_QUANTITIES:
        size = int(masks[name].sum())
        quarterly[name] = {
            "patterns": size,
            "truth": truth_q["proportions"][name].tolist(),
            "debiased_mean": res["debiased"][name].mean(axis=0).tolist(),
            "debiased_sd": res["debiased"][name].std(axis=0, ddof=1).tolist(),
            "raw_mean": res["raw"][name].mean(axis=0).tolist(),
            "raw_sd": res["raw"][name].std(axis=0, ddof=1).tolist(),
            # What the padding alone predicts for the raw answer: (C + n_pad·|q|) / m.
            "raw_expected": ((truth_q["counts"][name] + n_pad * size) / m_mean).tolist(),
            # Per-bin error sd ≤ σ + 1/2 (Theorem 3.2's proof), |q| bins, mean of R runs.
            "mean_sd_bound": size * (sigma + 0.5) / (n * math.sqrt(runs)),
        }
    cum_mean = res["cumulative"].mean(axis=0)
    cum_sd = res["cumulative"].std(axis=0, ddof=1)
    bound = theorem_3_2_bound(n, horizon, WINDOW, args.rho, BETA)
    err = res["err_debiased"]
    counters: dict[str, Any] = {}
    worst: dict[str, np.ndarray] = {}
    for c, vals in res["cumulative_by_counter"].items():
        worst[c] = np.abs(vals - truth_cum[None])[:, :, 1:].max(
            axis=(1, 2)
        )  # per run, over (t, b ≥ 1)
        counters[c] = {
            "max_error_mean": float(worst[c].mean()),
            "max_error_median": float(np.median(worst[c])),
            "max_error_p95": float(np.percentile(worst[c], 95)),
            "max_error_sd": float(worst[c].std(ddof=1)),
            "counter_max_sd": res["cumulative_max_sd"][c],
        }
    counters["factorization_over_tree"] = (
        counters["factorization"]["max_error_mean"] / counters["tree"]["max_error_mean"]
    )
    # the same runs (seeds, panel) for both counters: the paired difference's spread
    counters["tree_minus_factorization_sd"] = float(
        (worst["tree"] - worst["factorization"]).std(ddof=1)
    )
    return {
        "config": {
            "n": n,
            "horizon": horizon,
            "window": WINDOW,
            "rho": args.rho,
            "beta": BETA,
            "neighbours": NEIGHBOURS,
            "runs": runs,
            "seed_base": None if args.secure else args.seed,
            "secure": bool(args.secure),
            "data_seed": args.data_seed,
        },
        "fixed_window": {
            "n_pad": n_pad,
            "n_pad_constant": bool(np.all(res["n_pad"] == n_pad)),
            "m_mean": m_mean,
            "m_sd": float(res["m"].std(ddof=1)),
            "sigma_bin": sigma,
            "theorem_3_2_bound": bound,
            # Bins whose projected count left [0, |I_z|] (padding too small; probability ≤ β per run).
            "runs_with_clamping": int((res["clamps"] > 0).sum()),
        },
        "quarterly": {"quarter_end": truth_q["quarter_end"].tolist(), **quarterly},
        "cumulative": {
            "t": list(range(1, horizon + 1)),
            "b": CUMULATIVE_B,
            "truth": truth_cum[:, CUMULATIVE_B].tolist(),
            "mean": cum_mean[:, CUMULATIVE_B].tolist(),
            "sd": cum_sd[:, CUMULATIVE_B].tolist(),
            "max_abs_mean_error_all_b": float(np.abs(cum_mean - truth_cum)[:, 1:].max()),
        },
        "cumulative_counters": counters,
        "window_error": {
            "t": list(range(WINDOW, horizon + 1)),
            "median": np.median(err, axis=0).tolist(),
            "p2_5": np.percentile(err, 2.5, axis=0).tolist(),
            "p97_5": np.percentile(err, 97.5, axis=0).tolist(),
            "raw_median": np.median(res["err_raw"], axis=0).tolist(),
            "bound": bound,
            "runs_exceeding_bound": int((err.max(axis=1) > bound).sum()),
        },
        "seconds": {"synthesizer_runs": res["seconds"]},
    }


def print_table(summary: dict, out=None) -> None:
    out = sys.stdout if out is None else out  # resolved at call time so redirection works
    cfg = summary["config"]
    fw = summary["fixed_window"]
    seeds = (
        "secure"
        if cfg["secure"]
        else f"seeds {cfg['seed_base']}..{cfg['seed_base'] + cfg['runs'] - 1}"
    )
    print(
        f"n={cfg['n']} T={cfg['horizon']} k={cfg['window']} rho={cfg['rho']} runs={cfg['runs']} "
        f"n_pad={fw['n_pad']} m≈{fw['m_mean']:.0f} σ_bin={fw['sigma_bin']:.1f} "
        f"({seeds})",
        file=out,
    )
    quarterly = summary["quarterly"]
    print("\nQuarterly poverty proportions (fixed-window synthesizer)", file=out)
    print(
        f"{'quantity':<24}{'Q':>2} {'truth':>8} {'debiased':>9} {'sd':>7} {'raw':>8} {'raw pred':>9}",
        file=out,
    )
    for name, label in Q.QUARTERLY_QUANTITIES:
        rec = quarterly[name]
        for j, _end in enumerate(quarterly["quarter_end"]):
            print(
                f"{label if j == 0 else '':<24}{j + 1:>2} {rec['truth'][j]:8.4f} {rec['debiased_mean'][j]:9.4f} "
                f"{rec['debiased_sd'][j]:7.4f} {rec['raw_mean'][j]:8.4f} {rec['raw_expected'][j]:9.4f}",
                file=out,
            )
    cum = summary["cumulative"]
    print(
        f"\nCumulative: proportion ≥ {cum['b']} months in poverty up to month t (cumulative synthesizer)",
        file=out,
    )
    print(f"{'t':>3} {'truth':>8} {'mean':>8} {'sd':>7}", file=out)
    for t, tr, mu, sd in zip(cum["t"], cum["truth"], cum["mean"], cum["sd"]):
        print(f"{t:>3} {tr:8.4f} {mu:8.4f} {sd:7.4f}", file=out)
    cc = summary["cumulative_counters"]
    print(
        "\nCumulative synthesizer, max over (t, b) of |Ŝ_b^t − S_b^t| / n per run, by counter",
        file=out,
    )
    print(f"{'counter':<14} {'mean':>8} {'median':>8} {'p95':>8} {'counter max sd':>15}", file=out)
    for c in CUMULATIVE_COUNTERS:
        r = cc[c]
        print(
            f"{c:<14} {r['max_error_mean']:8.5f} {r['max_error_median']:8.5f} {r['max_error_p95']:8.5f} "
            f"{r['counter_max_sd']:15.5f}",
            file=out,
        )
    print(f"factorization / tree (mean max error): {cc['factorization_over_tree']:.3f}", file=out)
    we = summary["window_error"]
    print("\nFixed-window error max_s |p_s - n_pad - C_s| / n (median [2.5%, 97.5%])", file=out)
    for t, med, lo, hi, rawm in zip(
        we["t"], we["median"], we["p2_5"], we["p97_5"], we["raw_median"]
    ):
        print(
            f"t={t:>2}: {med:.4f} [{lo:.4f}, {hi:.4f}]   raw (no debiasing) median {rawm:.4f}",
            file=out,
        )
    print(
        f"Theorem 3.2 bound (β={cfg['beta']}): {we['bound']:.4f}; runs exceeding it: "
        f"{we['runs_exceeding_bound']}/{cfg['runs']}",
        file=out,
    )
    print(
        f"runs with a clamped (padding too small) bin: {fw['runs_with_clamping']}/{cfg['runs']}",
        file=out,
    )
    print(f"synthesizer runs took {summary['seconds']['synthesizer_runs']:.1f} s", file=out)


def _violins(ax, data: np.ndarray, positions, color: str):
    parts = ax.violinplot(
        data, positions=positions, widths=0.32, showextrema=False, showmedians=True
    )
    for body in parts["bodies"]:
        body.set_facecolor(color)
        body.set_edgecolor(color)
        body.set_alpha(0.55)
    parts["cmedians"].set_color(color)


def plot_figures(panel: np.ndarray, res: dict, summary: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cfg = summary["config"]
    subtitle = f"ρ = {cfg['rho']}, {cfg['runs']} runs, n = {cfg['n']:,} (simulated SIPP-like panel)"
    paths = []
    raw_c, deb_c, truth_c = "tab:orange", "tab:blue", "black"

    # Figure 1: quarterly quantities.
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    quarters = np.arange(1, len(summary["quarterly"]["quarter_end"]) + 1)
    for ax, (name, label) in zip(axes.ravel(), Q.QUARTERLY_QUANTITIES):
        _violins(ax, res["raw"][name], quarters - 0.18, raw_c)
        _violins(ax, res["debiased"][name], quarters + 0.18, deb_c)
        truth = summary["quarterly"][name]["truth"]
        ax.scatter(quarters, truth, marker="x", s=70, color=truth_c, zorder=5, linewidths=2)
        ax.set_title(f"{label} of the quarter")
        ax.set_ylabel("proportion of households")
        ax.set_xticks(quarters, [f"Q{q}" for q in quarters])
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("quarter")
    handles = [
        Patch(color=raw_c, alpha=0.55, label="synthetic, raw (count / m)"),
        Patch(color=deb_c, alpha=0.55, label="synthetic, debiased ((count − n_pad·|q|) / n)"),
        Line2D([], [], marker="x", color=truth_c, linestyle="none", markersize=8, label="truth"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"Quarterly poverty from fixed-window synthetic data (k = {WINDOW})\n{subtitle}")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    paths.append(out / "fig1_quarterly.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    # Figure 2: cumulative ≥ b months up to t.
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 5))
    horizon = panel.shape[1]
    ts = np.arange(1, horizon + 1)
    truth_cum = Q.cumulative_counts(panel) / panel.shape[0]
    b = CUMULATIVE_B
    vals_b = res["cumulative"][:, :, b]
    _violins(ax1, vals_b, ts, deb_c)
    ax1.scatter(ts, truth_cum[:, b], marker="x", s=70, color=truth_c, zorder=5, linewidths=2)
    ax1.set_title(f"≥ {b} months in poverty up to month t")
    ax1.set_ylabel("proportion of households")
    # The spread is small against the level: the middle panel shows it on its own scale.
    _violins(ax2, vals_b - truth_cum[:, b], ts, deb_c)
    ax2.axhline(0.0, color=truth_c, linewidth=1)
    ax2.scatter(ts, np.zeros(horizon), marker="x", s=70, color=truth_c, zorder=5, linewidths=2)
    ax2.set_title(f"≥ {b} months: synthetic − truth (noise distribution over runs)")
    ax2.set_ylabel("error (proportion of households)")
    for ax in (ax1, ax2):
        ax.legend(
            handles=[
                Patch(color=deb_c, alpha=0.55, label="cumulative synthetic data"),
                Line2D(
                    [], [], marker="x", color=truth_c, linestyle="none", markersize=8, label="truth"
                ),
            ],
            loc="upper left",
        )
    colors = plt.cm.viridis(np.linspace(0, 0.9, 4))
    for color, bb in zip(colors, (1, 2, 3, 6)):
        vals = res["cumulative"][:, :, bb]
        lo, hi = np.percentile(vals, [2.5, 97.5], axis=0)
        ax3.fill_between(ts, lo, hi, color=color, alpha=0.2)
        ax3.plot(
            ts, vals.mean(axis=0), color=color, label=f"≥ {bb} months: synthetic mean (95% band)"
        )
        ax3.scatter(ts, truth_cum[:, bb], marker="x", color=color, s=40, zorder=5)
    ax3.set_title("≥ b months up to month t: mean over runs vs truth (X)")
    ax3.set_ylabel("proportion of households")
    ax3.legend(fontsize=8, loc="upper left")
    for ax in (ax1, ax2, ax3):
        ax.set_xlabel("month t")
        ax.set_xticks(ts)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Cumulative-time queries from cumulative synthetic data\n{subtitle}")
    fig.tight_layout()
    paths.append(out / "fig2_cumulative.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    # Figure 3: fixed-window error per step, debiased and raw.
    # Separate y scales: the raw error is an order of magnitude larger and would flatten the debiased curves.
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    tw = np.arange(WINDOW, horizon + 1)
    bound = summary["window_error"]["bound"]
    for ax, key, title in (
        (ax1, "err_debiased", "debiased: max_s |p_s − n_pad − C_s| / n"),
        (ax2, "err_raw", "raw (no debiasing): max_s |p_s / m − C_s / n|"),
    ):
        e = res[key]
        ax.plot(tw, np.median(e, axis=0), color=deb_c, label="median over runs")
        ax.plot(
            tw,
            np.percentile(e, 2.5, axis=0),
            color=deb_c,
            linestyle=":",
            label="2.5 / 97.5 percentiles",
        )
        ax.plot(tw, np.percentile(e, 97.5, axis=0), color=deb_c, linestyle=":")
        ax.axhline(
            bound,
            color="black",
            linestyle="--",
            label=f"Theorem 3.2 bound on the debiased error (β = {BETA})",
        )
        ax.set_title(title)
        ax.set_xlabel("month t")
        ax.set_xticks(tw)
        ax.set_ylim(
            0, 1.6 * max(bound, float(np.percentile(e, 97.5, axis=0).max()))
        )  # headroom for the legend
        ax.set_ylabel("max error over length-3 patterns (proportion)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Fixed-window synthesizer error per step (k = {WINDOW})\n{subtitle}")
    fig.tight_layout()
    paths.append(out / "fig3_window_error.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    panel = simulate_poverty_panel(n=args.n, horizon=HORIZON, seed=args.data_seed)
    res = run_experiment(
        panel,
        runs=args.runs,
        seed=args.seed,
        secure=args.secure,
        rho=args.rho,
        progress=not args.no_progress,
    )
    summary = summarise(panel, res, args)
    t0 = time.perf_counter()
    summary["figures"] = [str(p) for p in plot_figures(panel, res, summary, args.out)]
    summary["seconds"]["figures"] = time.perf_counter() - t0
    with open(args.out / "summary.json", "w") as fh:
        json.dump(summary, fh, indent=2)
    print_table(summary)
    print(f"\nwrote {args.out / 'summary.json'} and {', '.join(summary['figures'])}")
    return summary


if __name__ == "__main__":
    main()
