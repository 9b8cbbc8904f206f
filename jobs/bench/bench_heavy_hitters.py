"""Benchmark of the shifting heavy-hitter step (python -m jobs.bench.bench_heavy_hitters [--json PATH]).

* Median step time per method at n = 10^6 users for |X| = 10^6 and |X| = 2^32 (seeded source by
  default; ``--secure`` uses the OS CSPRNG, measured about 1.5x slower).
* Straightforward per-element loop of Algorithm 5 (one ThresholdMonitorEvolving.query per element,
  O(n·|X|) per step) against the sparse step on a small instance, as a ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from pipeline.monitors import METHODS, ShiftingHeavyHitters, ThresholdMonitorEvolving


def _stream(rng, n, domain, heavy_users):
    vals = rng.integers(0, domain, n, dtype=np.int64)
    vals[:heavy_users] = int(rng.integers(0, domain))
    return vals


def bench_large(n: int, domain: int, steps: int, seed: int, secure: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    data = [_stream(rng, n, domain, 20_000) for _ in range(steps)]
    out = {}
    for method in METHODS:
        hh = ShiftingHeavyHitters(
            domain, 1.0, 1e-6, 3, 10_000, method=method, seed=None if secure else seed
        )
        times = []
        for vals in data:
            t0 = time.perf_counter()
            hh.update(vals)
            times.append(time.perf_counter() - t0)
        out[method] = statistics.median(times)
    return out


def bench_loop_ratio(n: int, domain: int, steps: int, seed: int) -> dict:
    """Alg. 5 per element (dense) vs the sparse all-elements step, same internal parameters."""
    rng = np.random.default_rng(seed)
    data = [_stream(rng, n, domain, n // 5) for _ in range(steps)]
    args: dict[str, Any] = dict(epsilon=1.0, delta=1e-3, threshold=300, k=3)
    dense = ThresholdMonitorEvolving(n, seed=seed, **args)
    sparse = ThresholdMonitorEvolving(n, seed=seed + 1, **args)
    t_dense, t_sparse = [], []
    for vals in data:
        t0 = time.perf_counter()
        for x in range(domain):
            dense.query((vals == x).astype(np.float64))
        t_dense.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sparse.query_all_elements(vals, domain)
        t_sparse.append(time.perf_counter() - t0)
    d, s = statistics.median(t_dense), statistics.median(t_sparse)
    return {"n": n, "domain": domain, "loop_s": d, "sparse_s": s, "ratio": d / s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--secure", action="store_true", help="OS CSPRNG instead of the seeded source")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    results = {"users": args.users, "secure": args.secure, "large": {}, "loop": None}
    src = "secure" if args.secure else "seeded"
    print(
        f"median step time, n = {args.users:,} users, eps=1, delta=1e-6, k=3, horizon 1e4, {src} source"
    )
    print(f"{'|X|':>12} | " + " | ".join(f"{m:>11}" for m in METHODS))
    for domain in (1_000_000, 2**32):
        r = bench_large(args.users, domain, args.steps, args.seed, args.secure)
        results["large"][str(domain)] = r
        print(f"{domain:>12} | " + " | ".join(f"{r[m] * 1e3:>9.0f}ms" for m in METHODS))
    loop = bench_loop_ratio(2000, 500, 3, args.seed)
    results["loop"] = loop
    print(
        f"\nper-element loop of Alg. 5 vs sparse step (n={loop['n']}, |X|={loop['domain']}): "
        f"{loop['loop_s'] * 1e3:.0f} ms vs {loop['sparse_s'] * 1e3:.1f} ms, ratio {loop['ratio']:.0f}x"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
