"""Benchmark: exact discrete Gaussian / discrete Laplace samplers, ours vs OpenDP.

    python -m jobs.bench.bench_noise [--sizes 100000 1000000] [--repeats 3] [--sigma2 1000] [--scale 10]
                               [--json PATH] [--no-opendp]

For each sampler and size it times, best of ``--repeats`` runs:
  * ours, secure path (rng=None: os.urandom words),
  * ours, seeded path (PCG64; simulation only),
  * OpenDP (``make_gaussian`` / ``make_laplace`` on an integer vector domain: OpenDP's exact
    discrete Gaussian / discrete Laplace samplers on its CSPRNG), measurement built outside the
    timed region.
and prints draws per second, the ratio ours-secure / OpenDP, and the sample variance (a sanity
check that all three draw from the same distribution).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.privacy.noise import discrete_gaussian, discrete_laplace


def _best_of(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _opendp_samplers(sigma2: float, scale: float):
    import opendp.prelude as dp

    dp.enable_features("contrib")

    def gaussian(n: int):
        space = dp.vector_domain(dp.atom_domain(T=int), size=n), dp.l2_distance(T=int)
        meas = dp.m.make_gaussian(*space, scale=math.sqrt(sigma2))
        zeros = [0] * n
        return lambda: meas(zeros)

    def laplace(n: int):
        space = dp.vector_domain(dp.atom_domain(T=int), size=n), dp.l1_distance(T=int)
        meas = dp.m.make_laplace(*space, scale=float(scale))
        zeros = [0] * n
        return lambda: meas(zeros)

    from importlib.metadata import version

    return version("opendp"), gaussian, laplace


def run(sizes: list[int], repeats: int, sigma2: float, scale: float, with_opendp: bool) -> dict:
    rows: list[dict[str, Any]] = []
    opendp = None
    if with_opendp:
        try:
            opendp = _opendp_samplers(sigma2, scale)
        except ImportError:
            print("opendp not installed: skipping the baseline", file=sys.stderr)
    for sampler, param in (("discrete_gaussian", sigma2), ("discrete_laplace", scale)):
        ours = discrete_gaussian if sampler == "discrete_gaussian" else discrete_laplace
        for n in sizes:
            ours(param, 1000, rng=None)  # warm-up (imports, first allocations)
            cases = {
                "ours-secure": lambda: ours(param, n, rng=None),
                "ours-seeded": lambda: ours(param, n, rng=12345),
            }
            if opendp is not None:
                make = opendp[1] if sampler == "discrete_gaussian" else opendp[2]
                cases["opendp"] = make(n)
            timings = {}
            for path, fn in cases.items():
                seconds, out = _best_of(fn, repeats)
                var = float(np.var(np.asarray(out, dtype=np.float64)))
                timings[path] = seconds
                rows.append(
                    {
                        "sampler": sampler,
                        "param": param,
                        "path": path,
                        "n": n,
                        "seconds": seconds,
                        "draws_per_second": n / seconds,
                        "sample_variance": var,
                    }
                )
            if "opendp" in timings:
                for r in rows[-len(cases) :]:
                    r["speedup_vs_opendp"] = timings["opendp"] / r["seconds"]
    return {
        "sigma2": sigma2,
        "scale": scale,
        "repeats": repeats,
        "timing": "best of repeats, wall clock (time.perf_counter)",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "opendp": opendp[0] if opendp else None,
        "machine": platform.machine(),
        "rows": rows,
    }


def format_table(result: dict) -> str:
    head = f"{'sampler':<18} {'param':>10} {'path':<12} {'n':>9} {'seconds':>9} {'draws/s':>11} {'x OpenDP':>9} {'var':>10}"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        ratio = f"{r['speedup_vs_opendp']:.1f}" if "speedup_vs_opendp" in r else "-"
        lines.append(
            f"{r['sampler']:<18} {r['param']:>10g} {r['path']:<12} {r['n']:>9} {r['seconds']:>9.4f} "
            f"{r['draws_per_second']:>11.3g} {ratio:>9} {r['sample_variance']:>10.4g}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--sigma2", type=float, default=1000.0, help="discrete Gaussian variance parameter"
    )
    ap.add_argument("--scale", type=float, default=10.0, help="discrete Laplace scale")
    ap.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    ap.add_argument("--no-opendp", action="store_true", help="skip the OpenDP baseline")
    args = ap.parse_args(argv)
    if args.repeats < 1 or any(n < 1 for n in args.sizes):
        ap.error("--repeats and --sizes must be positive")
    result = run(args.sizes, args.repeats, args.sigma2, args.scale, not args.no_opendp)
    print(
        f"sigma2={args.sigma2:g} (OpenDP scale=sqrt(sigma2)), laplace scale={args.scale:g}, "
        f"best of {args.repeats}, opendp {result['opendp']}"
    )
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
