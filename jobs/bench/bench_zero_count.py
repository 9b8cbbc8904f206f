"""Cost of the exact zero-count draws against the floating-point inversion they replaced.

    python -m jobs.bench.bench_zero_count [--repeats 2000]

Per heavy-hitter step the sparse shortcut makes one Binomial draw (how many of the Z zero-count
elements cross the threshold) and, for restarted AboveThreshold, one geometric draw per ⊤. Both are
now exact (:mod:`pipeline.privacy.exact`). The baseline, in the same run, is the earlier float
path, kept here only as the reference: inverse survival function at a 53-bit uniform with
``scipy.special.betainc`` (Binomial) and ``log`` (geometric). Thresholds are the calibrated ones of a
tct deployment (ε = 1, δ = 10⁻⁶, k = 4, horizon 12), so n·p is tiny, as in production. Also timed:
the discrete Gaussian tail interval the naive method computes once per process.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from scipy import special

from pipeline.monitors.heavy_hitters import heavy_hitter_plan
from pipeline.privacy.laws import (
    DiscreteGaussianLaw,
    DiscreteLaplaceLaw,
    binomial_draw,
    geometric_draw,
)
from pipeline.privacy.rng import as_random_source


def _float_binomial(source, n: int, log_p: float) -> int:
    """The replaced float path: K = min{k : P(Bin > k) < U}, U on the 2^-53 grid."""
    p = math.exp(log_p)
    u = ((int(source.words(1)[0]) >> 11) + 0.5) * 2.0**-53
    k = 0
    while True:
        sf = (
            -math.expm1(n * math.log1p(-p))
            if k == 0
            else float(special.betainc(k + 1.0, float(n - k), p))
        )
        if sf < u:
            return k
        k += 1


def _float_geometric(source, log_p: float) -> float:
    u = ((int(source.words(1)[0]) >> 11) + 0.5) * 2.0**-53
    return math.floor(math.log(u) / math.log1p(-math.exp(log_p)))


def _per_draw_us(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / repeats * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2000)
    args = ap.parse_args(argv)
    src = as_random_source(5)
    rows = []
    for domain in (10**6, 2**32):
        plan = heavy_hitter_plan("tct", domain, 1.0, 1e-6, 4, 12)
        law, t = DiscreteLaplaceLaw(plan["scale"]), plan["threshold"]
        law_float = law.log_sf(t)
        exact = _per_draw_us(
            lambda: binomial_draw(src, domain, lambda d: law.sf_interval(t, d)), args.repeats
        )
        flt = _per_draw_us(lambda: _float_binomial(src, domain, law_float), args.repeats)
        rows.append(
            {
                "draw": "binomial (tct step)",
                "domain": domain,
                "p": math.exp(law_float),
                "exact_us": exact,
                "float_us": flt,
                "ratio": exact / flt,
            }
        )
        level = t // 2  # restarted AboveThreshold: a lower level, gaps of ~1/p ids
        g_log = law.log_sf(level)
        exact = _per_draw_us(
            lambda: geometric_draw(src, lambda d: law.sf_interval(level, d), limit=domain),
            args.repeats,
        )
        flt = _per_draw_us(lambda: _float_geometric(src, g_log), args.repeats)
        rows.append(
            {
                "draw": "geometric (svt gap)",
                "domain": domain,
                "p": math.exp(g_log),
                "exact_us": exact,
                "float_us": flt,
                "ratio": exact / flt,
            }
        )
    for row in rows:
        print(
            f"{row['draw']:<22} |X|={row['domain']:<11,} p={row['p']:.2e}  exact {row['exact_us']:8.1f} µs  "
            f"float {row['float_us']:7.1f} µs  ratio {row['ratio']:5.1f}x",
            flush=True,
        )
    plan = heavy_hitter_plan("naive", 10**6, 1.0, 1e-6, 4, 12)
    started = time.perf_counter()
    DiscreteGaussianLaw(plan["sigma2"]).sf_interval(plan["threshold"], 34)
    once = time.perf_counter() - started
    print(
        f"naive: discrete Gaussian tail interval (σ² = {plan['sigma2']:.0f}, once per process): {once * 1e3:.1f} ms"
    )
    print(json.dumps({"rows": rows, "naive_tail_once_s": once}))


if __name__ == "__main__":
    main()
