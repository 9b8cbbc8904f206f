"""PREM (Ghazi et al., arXiv 2502.14809) against the noisy-histogram baseline, at equal (ε, δ).

    python -m jobs.eval.eval_prem [--quick] [--seeds K] [--out out] [--json PATH] [--png PATH]

n = 10⁶ records (10⁵ with --quick) over |X| = 2¹⁶ elements, ε = 1, δ = 10⁻⁶, ζ = 0.1, β = 0.05,
replace-one neighbours. Two histograms, each with 10⁴ queries:

* **zipf**: Zipf(1.1) over a random order of the elements; queries are intervals of the element
  order with lengths log-uniform in [1, 4096];
* **population map** (real-looking): a 256 × 256 grid, 40 towns with power-law sizes and Gaussian
  spread plus a sparse rural background; queries are rectangles ("regions") with sides
  log-uniform in [1, 128].

Methods, all (1, 10⁻⁶)-DP:

* ``prem``: :class:`pipeline.synth.prem.PREM` with ``accounting="charged"`` (defaults);
* ``prem_paper``: the printed constants — its α is reported (> n), its output is the zero histogram;
* ``gauss_clip`` / ``laplace_clip``: h + discrete Gaussian (σ² = 1/ρ, ρ the largest with
  CKS(ρ, δ) ≤ ε; Δ₂² = 2) or + discrete Laplace (scale 2/ε, Δ₁ = 2), clipped at 0, answers summed;
* ``gauss_signed``: the same Gaussian histogram unclipped (may be negative; not a histogram).

Reported per dataset and method: the largest and the median relative error |f(ĥ) − f(h)|/f(h) over
the queries with f(h) ≥ 2α (α = PREM's a-priori α, the same query set for every method), the same
maximum over "wide" queries (≥ 1024 elements) and "narrow" ones (≤ 64), and the fit time. The PNG
shows relative error against true count for prem and gauss_clip (first seed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
from scipy import sparse

from pipeline.privacy.noise import discrete_gaussian, discrete_laplace
from pipeline.synth.prem import PREM
from pipeline.synth.prem_privacy import max_rho, paper_plan

EPS, DELTA, ZETA, BETA = 1.0, 1e-6, 0.1, 0.05
DOMAIN, SIDE, N_QUERIES = 2**16, 256, 10_000


def zipf_dataset(n: int, rng: np.random.Generator):
    p = 1.0 / np.arange(1, DOMAIN + 1) ** 1.1
    h = rng.multinomial(n, (p / p.sum())[rng.permutation(DOMAIN)]).astype(np.int64)
    lengths = np.exp(rng.uniform(0.0, math.log(4096), N_QUERIES)).astype(np.int64) + 1
    starts = rng.integers(0, DOMAIN - lengths + 1)
    rows = np.repeat(np.arange(N_QUERIES), lengths)
    cols = np.concatenate([np.arange(s, s + ln) for s, ln in zip(starts, lengths)])
    return h, _matrix(rows, cols)


def population_dataset(n: int, rng: np.random.Generator):
    towns = 40
    sizes = rng.pareto(1.2, towns) + 1.0
    weights = 0.9 * sizes / sizes.sum()
    counts = rng.multinomial(n, np.append(weights, 0.1))
    pts = []
    for k in range(towns):
        centre = rng.uniform(10, SIDE - 10, 2)
        spread = 1.0 + 6.0 * math.sqrt(sizes[k] / sizes.max())
        pts.append(np.rint(rng.normal(centre, spread, (counts[k], 2))))
    rural_cells = rng.choice(SIDE * SIDE, SIDE * SIDE // 20, replace=False)
    rural = rural_cells[rng.integers(0, rural_cells.size, counts[-1])]
    xy = np.clip(np.concatenate(pts), 0, SIDE - 1).astype(np.int64)
    cells = np.concatenate([xy[:, 0] * SIDE + xy[:, 1], rural])
    h = np.bincount(cells, minlength=SIDE * SIDE).astype(np.int64)
    w = np.exp(rng.uniform(0.0, math.log(128), N_QUERIES)).astype(np.int64) + 1
    v = np.exp(rng.uniform(0.0, math.log(128), N_QUERIES)).astype(np.int64) + 1
    x0, y0 = rng.integers(0, SIDE - w + 1), rng.integers(0, SIDE - v + 1)
    rows, cols = [], []
    for j in range(N_QUERIES):
        gx, gy = np.meshgrid(
            np.arange(x0[j], x0[j] + w[j]), np.arange(y0[j], y0[j] + v[j]), indexing="ij"
        )
        c = (gx * SIDE + gy).ravel()
        rows.append(np.full(c.size, j))
        cols.append(c)
    return h, _matrix(np.concatenate(rows), np.concatenate(cols))


def _matrix(rows: np.ndarray, cols: np.ndarray) -> sparse.csr_matrix:
    return sparse.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(N_QUERIES, DOMAIN))


def baselines(h: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    rho = max_rho(EPS, DELTA)
    gauss = h + discrete_gaussian(1.0 / rho, h.size, seed)  # Δ₂² = 2 under replace: σ² = 2/(2ρ)
    lap = h + discrete_laplace(2.0 / EPS, h.size, seed + 1)  # Δ₁ = 2 under replace
    return {
        "gauss_clip": np.maximum(gauss, 0),
        "laplace_clip": np.maximum(lap, 0),
        "gauss_signed": gauss,
    }


def _errors(q, truth, est, mask, size):
    if not mask.any():  # no query reaches 2α (small n): nothing to compare
        return {"max_rel": None, "median_rel": None, "max_rel_wide": None, "max_rel_narrow": None}
    rel = np.abs(q @ est - truth)[mask] / truth[mask]
    wide, narrow = size[mask] >= 1024, size[mask] <= 64
    return {
        "max_rel": float(rel.max()),
        "median_rel": float(np.median(rel)),
        "max_rel_wide": float(rel[wide].max()) if wide.any() else None,
        "max_rel_narrow": float(rel[narrow].max()) if narrow.any() else None,
    }


def evaluate(name: str, h: np.ndarray, q: sparse.csr_matrix, seeds: int) -> tuple[list[dict], dict]:
    truth = q @ h
    size = np.diff(q.indptr)
    results, scatter = [], {}
    paper = paper_plan(int(h.sum()), DOMAIN, N_QUERIES, ZETA, EPS, DELTA, BETA)
    for s in range(seeds):
        t0 = time.perf_counter()
        prem = PREM(DOMAIN, q, ZETA, EPS, DELTA, beta=BETA, seed=1000 + s, accounting="charged")
        t_plan = time.perf_counter() - t0
        a_priori = prem.alpha
        t0 = time.perf_counter()
        out = prem.fit(h)
        t_fit = time.perf_counter() - t0
        mask = truth >= 2.0 * a_priori
        t0 = time.perf_counter()
        base = baselines(h, 2000 + 7 * s)
        t_base = time.perf_counter() - t0
        methods = {"prem": out, "prem_paper": np.zeros(DOMAIN), **base}
        for method, est in methods.items():
            row = {
                "dataset": name,
                "seed": s,
                "method": method,
                "n": int(h.sum()),
                "alpha": a_priori,
                "alpha_realised": prem.alpha,
                "paper_alpha": paper.alpha,
                "queries_at_2alpha": int(mask.sum()),
                **_errors(q, truth, est, mask, size),
            }
            if method == "prem":
                got = q @ est
                broken = (got < (1 - ZETA) * truth - prem.alpha) | (
                    got > (1 + ZETA) * truth + prem.alpha
                )
                row.update(
                    calls=prem.calls,
                    rounds=prem.rounds_used,
                    exhausted=prem.exhausted,
                    guarantee_violations=int(broken.sum()),
                    plan_seconds=t_plan,
                    fit_seconds=t_fit,
                    baseline_seconds=t_base,
                )
            results.append(row)
        if s == 0:
            scatter = {
                "truth": truth,
                "prem": q @ out,
                "gauss_clip": q @ base["gauss_clip"],
                "alpha": a_priori,
            }
    return results, scatter


def _plot(scatters: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scatters), figsize=(6 * len(scatters), 4.5), squeeze=False)
    for ax, (name, sc) in zip(axes[0], scatters.items()):
        truth = sc["truth"]
        keep = truth > 0
        for method, colour in (("gauss_clip", "tab:orange"), ("prem", "tab:blue")):
            rel = np.abs(sc[method][keep] - truth[keep]) / truth[keep]
            ax.scatter(truth[keep], np.maximum(rel, 1e-5), s=3, alpha=0.4, c=colour, label=method)
        ax.axvline(2 * sc["alpha"], color="k", ls="--", lw=1, label="2α (PREM)")
        ax.axhline(ZETA, color="grey", ls=":", lw=1, label="ζ")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("true count f(h)")
        ax.set_ylabel("relative error")
        ax.set_title(f"{name}: ε = {EPS}, δ = {DELTA}, |F| = {N_QUERIES}")
        ax.legend(markerscale=4, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(results: list[dict]) -> str:
    lines = [
        "| dataset | method | α (realised) | queries ≥ 2α | max rel. err. | median | max, wide | max, narrow |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["dataset"], r["method"]) for r in results}, key=lambda k: (k[0], k[1] != "prem", k[1])
    )
    for ds, method in keys:
        rows = [r for r in results if r["dataset"] == ds and r["method"] == method]

        def worst(k):
            vals = [r[k] for r in rows if r[k] is not None]
            return f"{max(vals):.3f}" if vals else "–"

        alpha = f"{rows[0]['alpha']:.0f} ({max(r['alpha_realised'] for r in rows):.0f})"
        if method == "prem_paper":
            alpha = f"{rows[0]['paper_alpha']:.2e}"
        lines.append(
            f"| {ds} | {method} | {alpha} | {rows[0]['queries_at_2alpha']} | {worst('max_rel')} | "
            f"{worst('median_rel')} | {worst('max_rel_wide')} | {worst('max_rel_narrow')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e5 and one seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="out")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default="docs/img/prem_relative_error.png")
    args = ap.parse_args(argv)
    n = 100_000 if args.quick else 1_000_000
    seeds = 1 if args.quick else args.seeds
    rng = np.random.default_rng(2025)
    results, scatters = [], {}
    for name, make in (("zipf", zipf_dataset), ("population map", population_dataset)):
        h, q = make(n, rng)
        rows, scatters[name] = evaluate(name, h, q, seeds)
        results += rows
        for r in rows:
            if r["method"] == "prem":
                print(
                    f"{name} seed {r['seed']}: alpha {r['alpha']:.0f} (realised {r['alpha_realised']:.0f}), "
                    f"{r['calls']} calls, {r['rounds']} rounds, exhausted {r['exhausted']}, "
                    f"(zeta, alpha) violations {r['guarantee_violations']}, fit {r['fit_seconds']:.2f}s "
                    f"(plan {r['plan_seconds']:.2f}s; baseline {r['baseline_seconds']:.2f}s)",
                    flush=True,
                )
    table = _table(results)
    print(table)
    _plot(scatters, args.png)
    print(f"wrote {args.png}")
    path = args.json or os.path.join(args.out, "eval_prem.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(
            {
                "epsilon": EPS,
                "delta": DELTA,
                "zeta": ZETA,
                "beta": BETA,
                "results": results,
                "table": table,
            },
            fh,
            indent=1,
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
