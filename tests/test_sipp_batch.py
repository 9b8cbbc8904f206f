"""The SIPP batch job in quick mode: files written, and the numbers agree with what theory predicts.

Tolerances (derived, not tuned):

* Fixed window. Theorem 3.2's proof writes the error of a bin as Θ = G + B with E[Θ] = 0,
  Var(G) = σ², σ² = (T − k + 1) / (2ρ), and |B| ≤ 1/2, so sd(Θ) ≤ σ + 1/2. A query over |q|
  patterns sums |q| such errors (however correlated): sd ≤ |q|(σ + 1/2). The debiased proportion
  divides by n, and the mean of R independent runs has sd ≤ |q|(σ + 1/2) / (n√R). We allow 4 of
  those (16 quarter × quantity checks).
* The raw proportion (count / m) centres on (C + n_pad·|q|) / m: to first order the m-fluctuation
  averages out, leaving the same count error over m ≥ n.
* Cumulative synthesizer: b ones cannot be reached before step b, so "≥ 3 months" is exactly 0 at
  t = 1, 2; later the mean over runs must sit within 5 standard errors (empirical sd / √R).
"""

import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from jobs.eval import sipp_batch as job
from pipeline import queries as Q
from pipeline.sim import simulate_poverty_panel

RUNS = job.QUICK_RUNS


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("sipp_batch")
    summary = job.main(["--quick", "--out", str(out), "--seed", "100", "--no-progress"])
    return out, summary


def test_files_written(result):
    out, summary = result
    for name in ("fig1_quarterly.png", "fig2_cumulative.png", "fig3_window_error.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, name
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["config"] == summary["config"]
    assert on_disk["config"]["runs"] == RUNS and on_disk["config"]["seed_base"] == 100
    assert on_disk["config"]["neighbours"] == "add_remove"


@pytest.fixture(scope="module")
def truth():
    panel = simulate_poverty_panel(n=job.N_HOUSEHOLDS, horizon=job.HORIZON, seed=job.DATA_SEED)
    return panel, Q.quarterly_poverty(panel)


def test_quarterly_debiased_mean_matches_truth_raw_is_biased(result, truth):
    _, summary = result
    panel, true_q = truth
    n = panel.shape[0]
    sigma = math.sqrt((job.HORIZON - job.WINDOW + 1) / (2 * job.RHO))
    n_pad = summary["fixed_window"]["n_pad"]
    m = summary["fixed_window"]["m_mean"]
    assert summary["fixed_window"]["n_pad_constant"]
    assert n_pad > 0 and abs(m - (n + 8 * n_pad)) < 6 * math.sqrt(8) * sigma
    for name, mask in Q.quarterly_masks(3).items():
        q = int(mask.sum())
        tol = 4 * q * (sigma + 0.5) / (n * math.sqrt(RUNS))
        rec = summary["quarterly"][name]
        np.testing.assert_allclose(rec["truth"], true_q["proportions"][name])
        deb = np.array(rec["debiased_mean"])
        raw = np.array(rec["raw_mean"])
        assert np.all(np.abs(deb - true_q["proportions"][name]) <= tol), (name, deb, tol)
        predicted_raw = (true_q["counts"][name] + n_pad * q) / m
        assert np.all(np.abs(raw - predicted_raw) <= tol + 1e-4), (name, raw, predicted_raw)
        # The noise is real: runs spread at least like a single bin's noise would suggest.
        assert np.all(np.array(rec["debiased_sd"]) > 0.2 * sigma / n)
    # For "≥1 month" the padding bias n_pad·7/n is far outside the tolerance: debiasing matters.
    q = 7
    tol = 4 * q * (sigma + 0.5) / (n * math.sqrt(RUNS))
    raw = np.array(summary["quarterly"]["at_least_1"]["raw_mean"])
    assert np.all(raw - true_q["proportions"]["at_least_1"] > 2 * tol)


def test_cumulative_mean_matches_truth(result, truth):
    _, summary = result
    panel, _ = truth
    cum = summary["cumulative"]
    true_b = Q.cumulative_at_least(panel, cum["b"])[1]
    np.testing.assert_allclose(cum["truth"], true_b)
    mean, sd = np.array(cum["mean"]), np.array(cum["sd"])
    assert np.all(mean[: cum["b"] - 1] == 0.0)
    later = slice(cum["b"] - 1, None)
    assert np.all(sd[later] > 0)
    assert np.all(np.abs(mean[later] - true_b[later]) <= 5 * sd[later] / math.sqrt(RUNS))


def test_window_error_within_theorem_bound_and_not_zero(result):
    _, summary = result
    we = summary["window_error"]
    n = summary["config"]["n"]
    sigma = summary["fixed_window"]["sigma_bin"]
    assert we["bound"] == pytest.approx(job.theorem_3_2_bound(n, 12, 3, 0.005, 0.05))
    # P(a run exceeds the bound) ≤ β, so the count is stochastically below Binomial(R, β):
    # allow up to its 0.999 quantile.
    assert we["runs_exceeding_bound"] <= binom.ppf(0.999, RUNS, job.BETA)
    median = np.array(we["median"])
    # Max over 8 bins of |N(0, σ²)| has median ≈ 1.7σ: an exact copy of the data would fail here.
    assert np.all(median > 0.5 * sigma / n)
    assert np.all(np.array(we["raw_median"]) > median)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        job.parse_args(["--runs", "1"])
    with pytest.raises(SystemExit):
        job.parse_args(["--rho", "0"])
    assert job.parse_args(["--quick"]).runs == job.QUICK_RUNS
    assert job.parse_args([]).runs == job.DEFAULT_RUNS


def test_cumulative_counters_compared_on_the_same_runs(result):
    """Both counters run on the same panel and seeds. The factorization's largest counter sd is
    its synthesizer's analytic one, far below the tree's (docs/synthesizers.md), and its mean
    max error over (t, b) is below the tree's by more than 5 standard errors of the paired mean
    difference (runs are i.i.d.: the standard error is the per-run difference's sd over √R)."""
    from pipeline.synth.cumulative import CumulativeSynthesizer

    _, summary = result
    cc = summary["cumulative_counters"]
    for counter in ("tree", "factorization"):
        c = CumulativeSynthesizer(job.HORIZON, job.RHO, neighbours=job.NEIGHBOURS, counter=counter, seed=0)
        worst = max(math.sqrt(c.counter_variance(b, t)) for b in range(1, job.HORIZON + 1)
                    for t in range(b, job.HORIZON + 1)) / job.N_HOUSEHOLDS
        assert cc[counter]["counter_max_sd"] == pytest.approx(worst, rel=1e-12)
    assert cc["factorization"]["counter_max_sd"] < 0.6 * cc["tree"]["counter_max_sd"]
    se = cc["tree_minus_factorization_sd"] / math.sqrt(RUNS)
    assert cc["tree"]["max_error_mean"] - cc["factorization"]["max_error_mean"] > 5 * se
    assert cc["factorization_over_tree"] == pytest.approx(
        cc["factorization"]["max_error_mean"] / cc["tree"]["max_error_mean"])
