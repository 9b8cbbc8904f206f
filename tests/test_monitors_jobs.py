"""Smoke tests of the heavy-hitter benchmark and evaluation jobs on tiny instances."""

import numpy as np

from jobs.bench import bench_heavy_hitters as bench
from jobs.eval import eval_heavy_hitters as ev


def test_bench_loop_ratio_small():
    out = bench.bench_loop_ratio(300, 40, 1, seed=1)
    assert out["loop_s"] > 0 and out["sparse_s"] > 0 and out["ratio"] > 1


def test_eval_run_counts_recall_and_false_positives():
    rng = np.random.default_rng(2)
    domain, n, horizon = 10_000, 6000, 6

    def gen():
        for t in range(horizon):
            vals = rng.integers(0, domain, n)
            vals[:5000] = 7  # weight 5000 ≫ tct τ on this instance
            yield vals, [(7, "big")]

    # k = horizon: the same users are heavy at every step (the k* premise needs k ≥ horizon here)
    stream = dict(name="tiny", n=n, domain=domain, horizon=horizon, k=horizon, occurrences=horizon,
                  labels=["big"], sizes={"big": 5000}, gen=gen)
    res = ev.run(stream, "tct", seed=3)
    assert res["tau"] < 5000
    assert res["recall_by_weight"] == {"big": 1.0}
    assert res["recall_at_tau"] == 1.0 and res["n_at_tau"] == horizon
    assert res["false_positives_weight0"] == 0
    assert res["smallest_reliable_weight"] == 5000


def test_tau_vs_horizon_shapes():
    curves = ev.tau_vs_horizon(10_000, 3, 0.03)
    tct, naive = curves["tau"]["tct"], curves["tau"]["naive"]
    # naive grows like √horizon; tct only through the log of the union bound
    assert naive[-1] / naive[0] > 20 and tct[-1] / tct[0] < 2


def test_eval_run_shows_retirement_when_the_premise_fails():
    rng = np.random.default_rng(4)
    domain, n, horizon = 10_000, 6000, 6

    def gen():
        for t in range(horizon):
            vals = rng.integers(0, domain, n)
            vals[:5000] = 7
            yield vals, [(7, "big")]

    # k = 3 < 6 heavy steps per user: holders retire after 3 flags, later steps are missed
    stream = dict(name="tiny", n=n, domain=domain, horizon=horizon, k=3, occurrences=horizon,
                  labels=["big"], sizes={"big": 5000}, gen=gen)
    assert ev.run(stream, "tct", seed=5)["recall_by_weight"] == {"big": 0.5}
