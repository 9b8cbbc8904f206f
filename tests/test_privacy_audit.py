"""Privacy audit: statistical tests of the releases on neighbouring streams (replace relation).

Neighbouring streams differ in one user's whole sequence of reports, the all-missing one included
(docs/privacy.md). Each audit feeds both streams through the worker's aggregation
(pipeline.stream.ingest.partition_state / aggregators) into the mechanisms the releaser's engine builds for
the deployment (pipeline.stream.releaser.engine), over many seeded runs, and estimates the privacy loss the
outputs actually show, at a large budget where the test has power (as in DP-Auditorium or Google's
stochastic tester):

* Gaussian releases (fixed window, cumulative): project the noisy outputs on the difference of
  their means. Each mechanism is ρ-zCDP with Gaussian noise, i.e. μ-GDP with μ = √(2ρ) for the
  direction of the change (Dong, Roth & Su, "Gaussian differential privacy", JRSS-B 2022,
  Theorem 2.7 and Corollary 3.3: a Gaussian mechanism with sensitivity Δ and noise σ is Δ/σ-GDP;
  a projection is post-processing, so its μ can only be smaller). The estimated standardised
  shift μ̂ = (mean₁ − mean₀)/s has, for n runs per world, standard error
  √(2/n + μ²/(4n)) (Hedges & Olkin 1985, "Statistical Methods for Meta-Analysis", eq. 5.14), so
  μ̂ − Z·se is a lower confidence bound for μ; the audit fails when it exceeds √(2ρ_claimed), i.e.
  when the measured ρ = μ²/2 is above the charged ρ beyond the CI. Z = 4.5: one-sided false alarm
  probability 3.4e−6 for an arbitrary seed (the seeds are fixed, so the result is reproducible).
* Monitors (tct heavy hitters, band): an event E of the output; Clopper–Pearson bounds
  (Clopper & Pearson 1934, exact binomial intervals at 1 − 10⁻⁶ each) on P_D(E) and P_D'(E);
  the hockey-stick lower bound ε_LB = ln((P_D(E)_low − δ) / P_D'(E)_high) must not exceed the
  claimed ε (Dwork & Roth 2014, Definition 2.4, for the event E).

Negative controls (power): the same data with the engine calibrated for add_remove (the old
deployment default) must be rejected: under replace data a fixed-window release then delivers
2ρ, and the cumulative release up to 1.4ρ for the worst pair at T = 3 (found by enumerating all
pairs of binary sequences against the tree counter's released nodes).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from scipy import stats

from pipeline.config import RandomSourceConfig, parse_config
from pipeline.counters.tree import TreeCounter
from pipeline.privacy.neighbours import Neighbours
from pipeline.privacy.noise import discrete_gaussian
from pipeline.privacy.rng import as_random_source
from pipeline.releases.histograms import merge_histograms
from pipeline.stream.releaser.engine import ReleaseEngine
from support.neighbour_runs import feed_and_close, run_stream, whole_roster_state

Z = 4.5  # one-sided normal quantile of the Gaussian audit (false alarm 3.4e−6)
CP_ALPHA = 1e-6  # Clopper–Pearson two-sided level per probability of the event audits


def deployment(attributes: dict, release: dict, budget: dict, n: int, horizon: int, rule="default", defaults=None):
    return parse_config({
        "name": "audit", "roster": {"size": n}, "horizon": horizon, "attributes": attributes,
        "budget": {**budget, "allow_large": True}, "random": {"kind": "seeded", "seed": 0}, "steps": {"max_ahead": 0},
        "imputation": {"rule": rule, "default": defaults or {}}, "releases": [dict(release, name="r", share=1.0)],
    })


def seeded(dep, seed: int):
    return dep.model_copy(update={"random": RandomSourceConfig(kind="seeded", seed=seed)})


def old_calibration(dep):
    """The same deployment as the engine calibrated it before replace was enforced (add_remove);
    model_copy bypasses the configuration check on purpose: this is the negative control."""
    return dep.model_copy(update={"neighbours": Neighbours.ADD_REMOVE})


def worker_partials(dep, reports: dict[str, np.ndarray]) -> list[dict]:
    """The worker's partial aggregates of the release for every step (no feedback involved)."""
    state = whole_roster_state(dep)
    return [feed_and_close(state, t, {a: r[:, t - 1] for a, r in reports.items()})["releases"]["r"]
            for t in range(1, dep.horizon + 1)]


# ---- Gaussian releases -------------------------------------------------------------------------

def gdp_mu(out0: np.ndarray, out1: np.ndarray, direction: np.ndarray) -> tuple[float, float]:
    """μ̂ and its standard error from the outputs (runs × coordinates) of the two worlds projected
    on ``direction`` (the difference of the true released values, whitened like the outputs)."""
    p0, p1 = out0 @ direction, out1 @ direction
    n0, n1 = p0.size, p1.size
    s = math.sqrt(((n0 - 1) * p0.var(ddof=1) + (n1 - 1) * p1.var(ddof=1)) / (n0 + n1 - 2))
    mu = (p1.mean() - p0.mean()) / s
    se = math.sqrt((n0 + n1) / (n0 * n1) + mu * mu / (2 * (n0 + n1)))
    return float(mu), se


def measured_exceeds(out0, out1, direction, rho_claimed: float) -> tuple[bool, float]:
    """Whether the lower confidence bound of μ exceeds the claim's √(2ρ); also the measured ρ̂."""
    mu, se = gdp_mu(out0, out1, direction)
    return (mu - Z * se) > math.sqrt(2.0 * rho_claimed), mu * mu / 2.0


# Fixed window: binary panel, window 3, T = 3 (one update step), ρ = 1: σ² = 1 under replace (the
# discrete Gaussian's variance is then σ² to ~1e−8, so mean/sd is the Gaussian μ), 0.5 under add_remove.
FW_N, FW_T, FW_RHO, FW_ENGINE_RUNS, FW_RUNS = 6, 3, 1.0, 100, 20_000


def fw_worlds():
    dep = deployment({"x": {"type": "binary"}}, {"type": "fixed_window", "attribute": "x", "window": 3},
                     {"rho": FW_RHO}, FW_N, FW_T)
    present = np.zeros((FW_N, FW_T), dtype=np.int64)
    present[1::2] = 1
    present[0] = 1  # the audited user reports 1 every step ...
    absent = present.copy()
    absent[0] = -1  # ... or nothing at all (imputed to the default 0)
    return dep, {"x": present}, {"x": absent}


def fw_truth(dep, reports) -> np.ndarray:
    return np.concatenate([p["counts"] for p in worker_partials(dep, reports) if p["counts"] is not None])


def fw_engine_outputs(dep, reports, runs: int, seed0: int) -> np.ndarray:
    """Noisy window counts the releaser publishes (manifest ``noisy_counts``) less the public
    padding n_pad (also in the manifest), one row per run."""
    rows = []
    for s in range(runs):
        d = seeded(dep, seed0 + s)
        outs = run_stream(d, reports, ReleaseEngine(d, d.n))
        rows.append(np.concatenate([np.asarray(o.manifest["noisy_counts"]) - o.manifest["parameters"]["n_pad"]
                                    for step in outs for o in step if "noisy_counts" in o.manifest]))
    return np.asarray(rows, dtype=float)


def test_fixed_window_engine_publishes_truth_plus_its_calibrated_noise():
    """What the vectorised audit below replicates: over seeded runs of the full path (worker state →
    engine → manifest), noisy − true counts have mean 0 and variance σ² of the engine's mechanism.
    Σr²/σ² over m residuals is χ²_m for Gaussian noise (the discrete Gaussian at σ² = 1 has variance
    σ²(1 − 4e−8)); bounds at the 1e−6 quantiles — a √2 error in σ is far outside them."""
    dep, present, absent = fw_worlds()
    sigma2 = ReleaseEngine(dep, dep.n).mechanisms["r"].sigma2
    assert sigma2 == pytest.approx(1.0)
    for w, reports in enumerate((present, absent)):
        resid = fw_engine_outputs(dep, reports, FW_ENGINE_RUNS, 1000 * (w + 1)) - fw_truth(dep, reports)
        m = resid.size
        stat = float(np.sum(resid ** 2)) / sigma2
        assert stats.chi2.ppf(1e-6, m) < stat < stats.chi2.ppf(1 - 1e-6, m), (stat, m)
        assert abs(resid.mean()) < 5 * math.sqrt(sigma2 / m)


def fw_audit(dep, present, absent, seed: int) -> tuple[bool, float]:
    """The engine's fixed-window mechanism for ``dep`` (its σ²), on the worker's true counts of both
    worlds, FW_RUNS runs each with the library's exact sampler in one vectorised draw."""
    sigma2 = ReleaseEngine(dep, dep.n).mechanisms["r"].sigma2
    truth = [fw_truth(dep, w) for w in (present, absent)]
    direction = (truth[1] - truth[0]).astype(float)
    assert direction @ direction == 2  # −1 in bin 111, +1 in bin 000
    rng = as_random_source(seed)
    out = [t + discrete_gaussian(sigma2, FW_RUNS * t.size, rng).reshape(FW_RUNS, t.size) for t in truth]
    return measured_exceeds(out[0].astype(float), out[1].astype(float), direction, FW_RHO)


def test_fixed_window_delivers_no_more_than_its_charged_rho():
    dep, present, absent = fw_worlds()
    exceeded, rho_hat = fw_audit(dep, present, absent, 7)
    assert not exceeded, f"measured ρ {rho_hat:.3f} above the charged {FW_RHO}"
    assert rho_hat == pytest.approx(FW_RHO, rel=0.1)  # not vacuous: the loss is there, at the claim


def test_negative_control_fixed_window_calibrated_for_add_remove_is_rejected():
    dep, present, absent = fw_worlds()
    exceeded, rho_hat = fw_audit(old_calibration(dep), present, absent, 8)
    assert exceeded, f"the audit missed a 2× violation (measured ρ {rho_hat:.3f}, charged {FW_RHO})"
    assert rho_hat == pytest.approx(2 * FW_RHO, rel=0.1)


# Cumulative: T = 3, worst pair (0, 0, 1) vs (1, 1, 1) for the audited user, ρ = 2 (every counter's
# σ² ≥ 0.6 under either calibration, where the discrete Gaussian's variance is σ² to < 1e−3).
CU_N, CU_T, CU_RHO, CU_RUNS = 6, 3, 2.0, 4000


def cu_worlds(rule: str):
    dep = deployment({"x": {"type": "binary"}}, {"type": "cumulative", "attribute": "x"}, {"rho": CU_RHO},
                     CU_N, CU_T, rule=rule)
    ones = np.tile(np.array([1, 0, 1], dtype=np.int64), (CU_N, 1))
    ones[0] = 1  # reports 1, 1, 1
    late = ones.copy()
    late[0] = [-1, -1, 1]  # sends nothing for two steps (imputed 0 under both rules), then 1
    return dep, {"x": ones}, {"x": late}


def released_nodes_of_prefixes(prefix: np.ndarray) -> np.ndarray:
    """Released node values from the published noisy prefix sums (runs × leaves): the node closing at
    leaf i is S̃_i − S̃_{i − lowbit(i)} (the tree's public structure; a bijection, so no loss)."""
    out = np.empty_like(prefix)
    for i in range(1, prefix.shape[1] + 1):
        j = i - (i & -i)
        out[:, i - 1] = prefix[:, i - 1] - (prefix[:, j - 1] if j else 0)
    return out


def cu_outputs(dep, reports, runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Released nodes of every counter for ``runs`` runs at once: the engine's cumulative mechanism
    gives ρ_b and the relation; its TreeCounter class runs ``runs`` independent counters (width)."""
    mech = ReleaseEngine(dep, dep.n).mechanisms["r"]
    z = np.array([p["z"] for p in worker_partials(dep, reports)])  # steps × (T + 1)
    rng = as_random_source(seed)
    noisy, true = [], []
    for b in range(1, dep.horizon + 1):
        counter = TreeCounter(dep.horizon - b + 1, float(mech.rhos[b - 1]), seed=rng, neighbours=mech.neighbours,
                              width=runs)
        steps = range(b, dep.horizon + 1)
        prefix = np.stack([counter.update(np.full(runs, z[t - 1, b])) for t in steps], axis=1).astype(float)
        noisy.append(released_nodes_of_prefixes(prefix))
        true.append(released_nodes_of_prefixes(np.cumsum(z[b - 1:, b])[None, :].astype(float))[0])
    return np.hstack(noisy), np.concatenate(true)


@pytest.mark.parametrize("rule", ["default", "carry_forward"])
def test_cumulative_delivers_no_more_than_its_charged_rho_and_add_remove_is_rejected(rule):
    dep, early, late = cu_worlds(rule)
    results = {}
    for label, d in (("replace", dep), ("add_remove", old_calibration(dep))):
        out0, true0 = cu_outputs(d, early, CU_RUNS, 1)
        out1, true1 = cu_outputs(d, late, CU_RUNS, 2)
        sd = np.sqrt((out0.var(axis=0, ddof=1) + out1.var(axis=0, ddof=1)) / 2)  # whiten (estimated)
        results[label] = measured_exceeds(out0 / sd, out1 / sd, (true1 - true0) / sd, CU_RHO)
    exceeded, rho_hat = results["replace"]
    assert not exceeded, f"measured ρ {rho_hat:.2f} above the charged {CU_RHO}"
    # the worst pair uses 0.7 of the replace-calibrated budget (1.4 / 2): 2L is an upper bound
    assert rho_hat == pytest.approx(0.7 * CU_RHO, rel=0.2)
    exceeded, rho_hat = results["add_remove"]
    assert exceeded, f"the audit missed the add_remove violation (measured ρ {rho_hat:.2f}, charged {CU_RHO})"


# ---- monitors: event probabilities, Clopper–Pearson, hockey stick --------------------------------

def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(stats.beta.ppf(CP_ALPHA / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - CP_ALPHA / 2, k + 1, n - k))
    return lo, hi


def epsilon_lower_bound(hits0: int, hits1: int, runs: int, delta: float) -> float:
    """Largest ε the event counts prove (either direction): ln((P_hi-world_low − δ)/P_other_high)."""
    best = 0.0
    for a, b in ((hits0, hits1), (hits1, hits0)):
        lo, _ = clopper_pearson(a, runs)
        _, hi = clopper_pearson(b, runs)
        if lo - delta > 0 and hi > 0:
            best = max(best, math.log((lo - delta) / hi))
    return best


def reseeded(mechanism, seed: int):
    """A fresh copy of an engine-built monitor drawing from its own seeded source (the calibration,
    which takes a bisection, is done once)."""
    m = copy.deepcopy(mechanism)
    m._rng_init(seed)
    return m


MON_RUNS, MON_EPS, MON_DELTA = 800, 4.0, 1e-6


def test_tct_heavy_hitters_event_within_claimed_epsilon():
    """One step, domain of 4 items: the audited user holds item 1 (present) or nothing (imputed to
    item 0); the other users put item 1's count just below the calibrated threshold. E = item 1 is
    flagged, published by the releaser from the workers' merged active-user histogram."""
    probe = deployment({"x": {"type": "hashed", "size": 4}}, {"type": "heavy_hitters", "attribute": "x",
                                                             "method": "tct", "k": 1},
                       {"epsilon": MON_EPS, "delta": MON_DELTA}, 8, 1)
    threshold = ReleaseEngine(probe, probe.n).mechanisms["r"].threshold
    n = threshold + 4
    dep = deployment({"x": {"type": "hashed", "size": 4}}, {"type": "heavy_hitters", "attribute": "x",
                                                           "method": "tct", "k": 1},
                     {"epsilon": MON_EPS, "delta": MON_DELTA}, n, 1, defaults={"x": 0})
    template = ReleaseEngine(dep, n).mechanisms["r"]
    present = np.full((n, 1), 2, dtype=np.int64)
    present[: threshold] = 1  # the audited user 0 and threshold − 1 others hold item 1
    absent = present.copy()
    absent[0] = -1
    hits = []
    for w, reports in enumerate((present, absent)):
        support, counts = merge_histograms(worker_partials(dep, {"x": reports}), 4)
        hits.append(sum(1 in reseeded(template, 100_000 * (w + 1) + s).release_histogram(support, counts)
                        for s in range(MON_RUNS)))
    assert 0 < hits[1] < hits[0] < MON_RUNS  # the event is informative in both worlds
    eps_lb = epsilon_lower_bound(hits[0], hits[1], MON_RUNS, MON_DELTA)
    assert eps_lb <= MON_EPS, (eps_lb, hits)


def test_band_monitor_event_within_claimed_epsilon():
    """One step: the audited user holds the watched value 'b' or nothing (imputed 'a'); the others
    put the count at high − 1. E = the answer is not Between."""
    low, high = 10, 20
    n = high + 5
    dep = deployment({"x": {"type": "categorical", "values": ["a", "b"]}},
                     {"type": "band_monitor", "attribute": "x", "value": "b", "low": low, "high": high},
                     {"epsilon": MON_EPS, "delta": MON_DELTA}, n, 1, defaults={"x": "a"})
    template = ReleaseEngine(dep, n).mechanisms["r"]
    watched = dep.attributes["x"].code(dep.release("r").value)
    present = np.zeros((n, 1), dtype=np.int64)
    present[:high] = watched  # the audited user 0 and high − 1 others hold 'b'
    absent = present.copy()
    absent[0] = -1
    hits = []
    for w, reports in enumerate((present, absent)):
        count = worker_partials(dep, {"x": reports})[0]["count"]
        hits.append(sum(reseeded(template, 200_000 * (w + 1) + s).release_count(count, low, high) != "between"
                        for s in range(MON_RUNS)))
    assert 0 < hits[1] < hits[0] < MON_RUNS
    eps_lb = epsilon_lower_bound(hits[0], hits[1], MON_RUNS, MON_DELTA)
    assert eps_lb <= MON_EPS, (eps_lb, hits)
