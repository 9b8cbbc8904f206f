"""Benchmark: continual counters at equal ρ — binary tree, tree + Honaker, square-root
factorization, BLT (ours) and jax-privacy's optimised BLT.

    python -m jobs.bench.bench_counters [--horizons 12 120 1000] [--rho 1.0] [--runs 300]
                                  [--neighbours add_remove] [--long 10000 100000] [--json PATH]

Per horizon T, all at the same ρ and relation:
  * error: the per-step standard deviation of S̃_t − S_t, max and mean over t = 1..T, analytic
    (each counter's ``variance_at``) and empirical (RMSE over ``--runs`` independent runs, the
    counters run with width = runs, i.e. independent noise per lane), and the ratio to the tree;
  * step time: mean wall time of ``update`` over the T steps of one counter (exact sampler,
    secure source), and the arithmetic alone (the sampler replaced by pre-drawn integers, the
    same for every counter), which shows how the cost depends on t.

Tree + Honaker: computed analytically, not run. Releasing *every* dyadic node (also the ones with
even index that the tree counter skips) costs the same ρ (a leaf still lies in ≤ L nodes), and the
best linear unbiased estimate of S_t from the nodes closed by t (Honaker, "Efficient use of
differentially private binary trees", 2015) decouples over the dyadic blocks of [1, t]; for a
complete subtree of height h the bottom-up estimate of its total has v_h = 1/(1/σ² + 1/(2 v_{h−1})),
v_0 = σ², and Var(S_t) = Σ_blocks v_h.

jax-privacy (optional extra ``bench``): ``buffered_toeplitz.optimize(n=T)`` gives its optimised
BLT C; its max error is ``max_loss`` = sens²·max_t (K Kᵀ)_tt and its per-step errors
``iteration_error``, for continuous Gaussian noise of σ² = sens²/(2ρ); the step time is its
jitted streaming C⁻¹ multiply plus a Gaussian draw. Its noise is real-valued (floating point),
not the exact discrete Gaussian, so it is an error baseline, not a deployable alternative here.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time

import numpy as np

from pipeline.counters import BLTCounter, SqrtFactorizationCounter, TreeCounter
from pipeline.counters.factorization import decoder_coefficients, sqrt_coefficients
from pipeline.privacy import noise as noise_module
from pipeline.privacy.neighbours import sensitivity_factor

COUNTERS = {"tree": TreeCounter, "factorization": SqrtFactorizationCounter, "blt": BLTCounter}


# ---------------------------------------------------------------------------------------------
# analytic errors
# ---------------------------------------------------------------------------------------------
def honaker_variances(T: int, rho: float, neighbours: str) -> np.ndarray:
    """Var(S_t estimate) for t = 1..T, BLUE over all closed dyadic nodes (module docstring)."""
    sigma2 = sensitivity_factor(neighbours) * T.bit_length() / (2.0 * rho)
    v = [sigma2]
    for _ in range(T.bit_length()):
        v.append(1.0 / (1.0 / sigma2 + 1.0 / (2.0 * v[-1])))
    return np.array(
        [sum(v[h] for h in range(t.bit_length()) if (t >> h) & 1) for t in range(1, T + 1)]
    )


def analytic(counter) -> np.ndarray:
    return np.array([counter.variance_at(t) for t in range(1, counter.horizon + 1)])


def sqrt_real_max_variance(T: int, rho: float) -> float:
    """The real-valued square-root factorization's max variance (add_remove), for long horizons."""
    c = sqrt_coefficients(T)
    beta = decoder_coefficients(c, T)
    return float(c @ c) * float(beta @ beta) / (2.0 * rho)


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------
def empirical(cls, T: int, rho: float, neighbours: str, runs: int, seed: int) -> np.ndarray:
    """Per-step RMSE over ``runs`` independent lanes on a random increment sequence."""
    x = np.random.default_rng(seed).integers(0, 100, T)
    k = cls(T, rho, seed=seed, neighbours=neighbours, width=runs)
    sq = np.zeros(T)
    for t in range(T):
        out = k.update(np.full(runs, x[t], dtype=np.int64))
        sq[t] = np.mean((out - x[: t + 1].sum()) ** 2.0)
    return np.sqrt(sq)


def step_time(
    cls, T: int, rho: float, neighbours: str, pre_drawn: bool, last: int | None = None
) -> float:
    """Mean seconds per update over the run (or its last ``last`` steps); secure source."""
    real = noise_module.discrete_gaussian
    if pre_drawn:
        pool = np.random.default_rng(0).integers(-1000, 1000, size=T + 16)
        pos = [0]

        def fake(sigma2, size, rng=None):
            pos[0] += size
            return pool[pos[0] - size : pos[0]]

        noise_module.discrete_gaussian = fake
    try:
        k = cls(T, rho, seed=None, neighbours=neighbours)
        stamps = np.empty(T + 1)
        stamps[0] = time.perf_counter()
        for t in range(T):
            k.update(3)
            stamps[t + 1] = time.perf_counter()
    finally:
        noise_module.discrete_gaussian = real
    d = np.diff(stamps)
    return float(d[-last:].mean() if last else d.mean())


# ---------------------------------------------------------------------------------------------
# jax-privacy
# ---------------------------------------------------------------------------------------------
def jax_privacy_blt(T: int, rho: float, neighbours: str):
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        from importlib.metadata import version

        import jax.numpy as jnp
        from jax_privacy.matrix_factorization import buffered_toeplitz as bt
    except Exception as exc:  # optional dependency
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    if neighbours != "add_remove":
        return {
            "available": False,
            "reason": "jax-privacy's BLT sensitivity is for single participation",
        }
    t0 = time.perf_counter()
    blt = bt.optimize(n=T)
    fit_s = time.perf_counter() - t0
    sens2 = float(bt.sensitivity_squared(blt, T))
    inv = blt.inverse()
    per_step = (
        np.array([float(bt.iteration_error(inv, i)) for i in range(T)]) if T <= 2000 else None
    )
    max_var = float(bt.max_loss(blt, T)) / (2.0 * rho)
    out = {
        "available": True,
        "version": version("jax-privacy"),
        "buffers": int(blt.buf_decay.size),
        "fit_seconds": fit_s,
        "max_std": math.sqrt(max_var),
    }
    if per_step is not None:
        out["mean_std"] = float(np.mean(np.sqrt(sens2 * per_step / (2.0 * rho))))
    # step: one streaming C⁻¹ multiply of a fresh N(0, σ²) draw, plus the running prefix sum
    sm = inv.as_streaming_matrix()
    step = jax.jit(lambda z, s: sm.multiply_next(z, s))
    key = jax.random.PRNGKey(0)
    state = sm.init_multiply(jnp.zeros(()))
    total = jnp.zeros(())
    sigma = math.sqrt(sens2 / (2.0 * rho))
    n_steps = min(T, 1000)
    keys = jax.random.split(key, n_steps + 1)
    draw = jax.jit(lambda k: sigma * jax.random.normal(k))
    y, state = step(draw(keys[0]), state)  # compile outside the timing
    y.block_until_ready()
    t0 = time.perf_counter()
    for i in range(1, n_steps):
        y, state = step(draw(keys[i]), state)
        total = total + y
    total.block_until_ready()
    out["step_seconds"] = (time.perf_counter() - t0) / (n_steps - 1)
    return out


# ---------------------------------------------------------------------------------------------
def bench(horizons, rho, runs, neighbours, long_horizons):
    rows = []
    for T in horizons:
        tree = TreeCounter(T, rho, neighbours=neighbours)
        an = {"tree": analytic(tree), "tree+honaker": honaker_variances(T, rho, neighbours)}
        for name in ("factorization", "blt"):
            an[name] = analytic(COUNTERS[name](T, rho, neighbours=neighbours))
        ref_max = math.sqrt(an["tree"].max())
        row = {"T": T, "counters": {}}
        for name, var in an.items():
            std = np.sqrt(var)
            entry = {
                "max_std": float(std.max()),
                "mean_std": float(std.mean()),
                "max_ratio_to_tree": float(std.max() / ref_max),
            }
            if name in COUNTERS:
                emp = empirical(COUNTERS[name], T, rho, neighbours, runs, seed=T)
                entry.update(
                    emp_max_rmse=float(emp.max()),
                    emp_mean_rmse=float(emp.mean()),
                    step_seconds=step_time(COUNTERS[name], T, rho, neighbours, pre_drawn=False),
                    step_seconds_no_sampler=step_time(
                        COUNTERS[name], T, rho, neighbours, pre_drawn=True
                    ),
                )
            row["counters"][name] = entry
        jp = jax_privacy_blt(T, rho, neighbours)
        if jp.get("available"):
            jp["max_ratio_to_tree"] = jp["max_std"] / ref_max
        row["counters"]["jax_privacy_blt"] = jp
        rows.append(row)
    long_rows = []
    for T in long_horizons:
        blt = BLTCounter(T, rho, neighbours=neighbours)
        tree = TreeCounter(T, rho, neighbours=neighbours)
        entry = {
            "T": T,
            "blt_max_std": math.sqrt(blt.variance_at(T)),
            "tree_max_std": math.sqrt(max(tree.variance_at(t) for t in range(1, T + 1))),
            "blt_step_seconds_no_sampler_last_1000": step_time(
                BLTCounter, T, rho, neighbours, True, last=1000
            ),
            "tree_step_seconds_no_sampler_last_1000": step_time(
                TreeCounter, T, rho, neighbours, True, last=1000
            ),
        }
        if neighbours == "add_remove":
            entry["sqrt_real_max_std"] = math.sqrt(sqrt_real_max_variance(T, rho))
            entry["blt_over_sqrt"] = entry["blt_max_std"] / entry["sqrt_real_max_std"]
        if T <= 10_000:
            entry["sqrt_step_seconds_no_sampler_last_1000"] = step_time(
                SqrtFactorizationCounter, T, rho, neighbours, True, last=1000
            )
        jp = jax_privacy_blt(T, rho, neighbours)
        if jp.get("available"):
            entry["jax_privacy_blt_max_std"] = jp["max_std"]
        long_rows.append(entry)
    return rows, long_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--horizons", type=int, nargs="+", default=[12, 120, 1000])
    ap.add_argument(
        "--long", type=int, nargs="*", default=[10_000, 100_000], help="BLT-only long horizons"
    )
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--neighbours", default="add_remove", choices=["add_remove", "replace"])
    ap.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = ap.parse_args(argv)
    rows, long_rows = bench(args.horizons, args.rho, args.runs, args.neighbours, args.long)
    print(
        f"continual counters at rho={args.rho}, {args.neighbours}; python {platform.python_version()}"
    )
    head = (
        f"{'T':>6} {'counter':<16} {'max sd':>8} {'mean sd':>8} {'/tree':>6} {'emp max':>8} {'emp mean':>8} "
        f"{'step ms':>8} {'arith us':>9}"
    )
    print(head)
    for row in rows:
        for name, e in row["counters"].items():
            if not e.get("available", True):
                print(f"{row['T']:>6} {name:<16} unavailable: {e['reason']}")
                continue
            print(
                f"{row['T']:>6} {name:<16} {e['max_std']:8.3f} {e.get('mean_std', float('nan')):8.3f} "
                f"{e['max_ratio_to_tree']:6.3f} {e.get('emp_max_rmse', float('nan')):8.3f} "
                f"{e.get('emp_mean_rmse', float('nan')):8.3f} {1e3 * e.get('step_seconds', float('nan')):8.3f} "
                f"{1e6 * e.get('step_seconds_no_sampler', float('nan')):9.1f}"
            )
    for e in long_rows:
        print("long horizon:", json.dumps(e))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "rho": args.rho,
                    "neighbours": args.neighbours,
                    "runs": args.runs,
                    "rows": rows,
                    "long": long_rows,
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
