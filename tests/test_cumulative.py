"""CumulativeSynthesizer (Bun et al. 2024, Algorithm 2 + Appendix B) with both counters (tree, factorization).

Seeded statistical tests; each tolerance names its source. S_b^t = #{weight ≥ b after t steps},
S̃ = counter output, Ŝ = monotonised count.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.serialization import dumps_state, loads_state
from pipeline.synth import CumulativeSynthesizer, counter_weights

Z_TOL = 4.5  # z-score tolerance for CLT-based checks


def true_counts(panel: np.ndarray) -> np.ndarray:
    """S[t, b] for t = 1..T (row t − 1), b = 0..T."""
    n, T = panel.shape
    w = np.cumsum(panel, axis=1)
    return np.array([[(w[:, t] >= b).sum() for b in range(T + 1)] for t in range(T)])


def z_counts(panel: np.ndarray, t: int) -> np.ndarray:
    """z_t[b] = #{weight b−1 after t−1 steps and x^t = 1}, length T + 1 (t 1-based)."""
    T = panel.shape[1]
    before = panel[:, : t - 1].sum(axis=1)
    return np.bincount(before[panel[:, t - 1] == 1] + 1, minlength=T + 1)


def markov_bits(rng, n, T, p_on=0.15, stay=0.8):
    x = np.empty((n, T), dtype=np.int64)
    x[:, 0] = rng.random(n) < p_on
    for t in range(1, T):
        keep = rng.random(n) < stay
        x[:, t] = np.where(keep, x[:, t - 1], rng.random(n) < p_on)
    return x


# ------------------------------------------------------------------------------------------
# budget split and calibration
# ------------------------------------------------------------------------------------------

def test_rho_split_follows_appendix_b():
    T, rho = 12, 0.005
    c = CumulativeSynthesizer(T, rho, seed=0, counter="tree")
    w = np.array([max(math.ceil(math.log2(T - b + 1)), 1) ** 3 for b in range(1, T + 1)], dtype=float)
    np.testing.assert_array_equal(counter_weights(T), w)
    np.testing.assert_allclose(c.rhos, rho * w / w.sum())
    assert c.rhos.sum() == pytest.approx(rho)  # Theorem 4.1: Σ_b ρ_b = ρ
    np.testing.assert_allclose(c.rhos / w, c.rhos[-1])  # ρ_b / w_b equal for all b
    for b, counter in enumerate(c.counters, start=1):
        assert counter.horizon == T - b + 1  # counter b runs over t = b..T
        assert counter.rho == pytest.approx(c.rhos[b - 1])
        levels = (T - b + 1).bit_length()  # ⌊log2(T−b+1)⌋ + 1 released levels (docs/synthesizers.md §2)
        assert counter.sigma2 == pytest.approx(levels / (2 * c.rhos[b - 1]))


def test_rho_split_weights_long_counters_by_root_horizon_and_sums_to_rho():
    """Shipped split (docs/synthesizers.md §9.6): w_b = V(h_b)·√h_b, h_b = T − b + 1, ρ_b = ρ·w_b/Σw.
    Accounting: Σ_b ρ_b = ρ (to the last float bit, so composition over b gives exactly ρ-zCDP);
    each counter's realised ρ (Δ²/(2σ²) from the σ² it draws with) is its ρ_b and never above it;
    counter b's max variance is V(h_b)/ρ_b = Σw/(ρ·√h_b), written out independently of the code."""
    from pipeline.counters.factorization import unit_rho_max_variance

    for T, rho in ((12, 0.005), (120, 0.05)):
        for neighbours in ("add_remove", "replace"):
            c = CumulativeSynthesizer(T, rho, seed=0, neighbours=neighbours)
            assert c.counter == "factorization" and c.parameters()["split_exponent"] == 0.5
            h = np.arange(T, 0, -1, dtype=float)
            v = np.array([unit_rho_max_variance(int(x), neighbours) for x in h])
            w = v * np.sqrt(h)
            np.testing.assert_allclose(counter_weights(T, "factorization", neighbours), w, rtol=1e-12)
            np.testing.assert_allclose(c.rhos, rho * w / w.sum(), rtol=1e-12)
            assert math.fsum(c.rhos) == pytest.approx(rho, rel=1e-15, abs=0)
            realised = np.array([k.realised_rho for k in c.counters])
            assert math.fsum(realised) <= rho * (1 + 1e-15)
            assert np.all(realised <= c.rhos)
            worst = [max(k.variance_at(t) for t in range(1, k.horizon + 1)) for k in c.counters]
            np.testing.assert_allclose(worst, w.sum() / (rho * np.sqrt(h)), rtol=1e-9)
            assert all(k.horizon == T - b for b, k in enumerate(c.counters))
    # the minimax split is exponent 0: every counter the same max variance Σ_b V_b/ρ
    c = CumulativeSynthesizer(12, 0.005, seed=0, split_exponent=0.0)
    worst = [max(k.variance_at(t) for t in range(1, k.horizon + 1)) for k in c.counters]
    np.testing.assert_allclose(worst, counter_weights(12, "factorization", exponent=0.0).sum() / 0.005, rtol=1e-9)
    with pytest.raises(ValueError, match="split_exponent"):
        CumulativeSynthesizer(12, 0.005, seed=0, split_exponent=float("nan"))


def test_error_bound_is_the_cell_by_cell_union_bound():
    """error_bound = smallest α with Σ_{b,t} 2·exp(−(α − 1/2)²/(2·Var_b(t))) ≤ β (sub-Gaussian tails,
    union over the T(T+1)/2 cells), recomputed here by a root finder; it is never above the
    largest-variance form √(2·max Var·ln(T(T+1)/β)) + 1/2."""
    from scipy.optimize import brentq

    T, rho, beta = 12, 0.005, 0.05
    for exponent in (0.0, 0.5):
        c = CumulativeSynthesizer(T, rho, beta=beta, seed=0, neighbours="replace", split_exponent=exponent)
        var = np.array([c.counter_variance(b, t) for b in range(1, T + 1) for t in range(b, T + 1)])
        alpha = brentq(lambda a: 2 * np.exp(-a * a / (2 * var)).sum() - beta, 1e-9, 1e6, xtol=1e-12)
        assert c.error_bound() == pytest.approx(alpha + 0.5, rel=1e-8)
        assert c.error_bound() >= alpha + 0.5
        assert c.error_bound() <= math.sqrt(2 * var.max() * math.log(T * (T + 1) / beta)) + 0.5


def test_factorization_max_counter_variance_below_tree():
    """The point of the option: at equal ρ the largest counter variance is several times smaller."""
    T, rho = 12, 0.005
    for neighbours in ("add_remove", "replace"):
        worst = {}
        for counter in ("tree", "factorization"):
            c = CumulativeSynthesizer(T, rho, seed=0, neighbours=neighbours, counter=counter)
            worst[counter] = max(c.counter_variance(b, t) for b in range(1, T + 1) for t in range(b, T + 1))
        assert math.sqrt(worst["factorization"] / worst["tree"]) < 0.6, (neighbours, worst)


def test_replace_doubles_every_counter_sigma2():
    a = CumulativeSynthesizer(9, 0.1, seed=0, counter="tree")
    r = CumulativeSynthesizer(9, 0.1, neighbours="replace", seed=0, counter="tree")
    for ca, cr in zip(a.counters, r.counters):
        assert cr.sigma2 == pytest.approx(2 * ca.sigma2)
    assert r.parameters()["neighbours"] == "replace"


# ------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(horizon=0, rho=1.0), ValueError, "horizon"),
        (dict(horizon=1.5, rho=1.0), TypeError, "horizon"),
        (dict(horizon=4, rho=0), ValueError, "rho"),
        (dict(horizon=4, rho=float("inf")), ValueError, "rho"),
        (dict(horizon=4, rho=1.0, beta=1.5), ValueError, "beta"),
        (dict(horizon=4, rho=1.0, neighbours="bounded"), ValueError, "neighbours"),
        (dict(horizon=4, rho=1.0, n=0), ValueError, "n"),
        (dict(horizon=4, rho=1.0, seed=1.5), TypeError, "rng"),
        (dict(horizon=4, rho=1.0, counter="sqrt"), ValueError, "counter"),  # blt is a counter choice now
    ],
)
def test_constructor_validation(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        CumulativeSynthesizer(**kwargs)


def test_update_and_counts_validation():
    c = CumulativeSynthesizer(3, 1.0, seed=0)
    with pytest.raises(ValueError, match=r"values must lie in \[0, 2\)"):
        c.update([0, 2, 1])
    with pytest.raises(ValueError, match="NaN"):
        c.update([0, np.nan, 1])
    with pytest.raises(ValueError, match="integer category codes"):
        c.update([0, 0.5, 1])
    with pytest.raises(ValueError, match="release_counts"):
        c.release_counts([0, 1, 0, 0])
    c.update(np.array([True, False, True]))  # bool is fine for bits
    with pytest.raises(ValueError, match="length 2 but .* n=3"):
        c.update([0, 1])
    c.update([1, 1, 1])
    c.update([0, 0, 0])
    with pytest.raises(RuntimeError, match="horizon"):
        c.update([0, 0, 0])
    k = CumulativeSynthesizer(3, 1.0, seed=0, n=4)
    with pytest.raises(ValueError, match="length 4"):
        k.release_counts([0, 1, 0])
    with pytest.raises(ValueError, match=r"z_t\[0\]"):
        k.release_counts([1, 1, 0, 0])
    with pytest.raises(ValueError, match="b > t"):
        k.release_counts([0, 1, 1, 0])
    with pytest.raises(ValueError, match="> n"):
        k.release_counts([0, 5, 0, 0])
    k.release_counts([0, 2, 0, 0])
    with pytest.raises(RuntimeError, match="do not mix"):
        k.update([0, 1, 0, 1])


# ------------------------------------------------------------------------------------------
# invariants, paths, state
# ------------------------------------------------------------------------------------------

def check_invariants(c: CumulativeSynthesizer, snapshots=None):
    T, n = c.horizon, c.n
    syn = np.asarray(c.synthetic).astype(np.int64)
    assert set(np.unique(syn)) <= {0, 1}
    w = np.cumsum(syn, axis=1)
    prev = np.zeros(T + 1, dtype=np.int64)
    prev[0] = n
    for t in range(1, c.t + 1):
        s = c.monotone_counts[t]
        # #records with synthetic weight ≥ b at t equals Ŝ_b^t (Algorithm 2's construction)
        np.testing.assert_array_equal([(w[:, t - 1] >= b).sum() for b in range(T + 1)], s)
        assert s[0] == n and np.all(s[t + 1 :] == 0)
        assert np.all(s >= prev)  # non-decreasing in t
        assert np.all(np.diff(s) <= 0)  # non-increasing in b
        assert np.all(s[1:] <= prev[:-1])  # Ŝ_b^t ≤ Ŝ_{b−1}^{t−1}
        prev = s
    if snapshots:
        for snap in snapshots:
            np.testing.assert_array_equal(syn[:, : snap.shape[1]], snap)


COUNTERS = ["tree", "factorization", "blt"]


@pytest.mark.parametrize("counter", COUNTERS)
@pytest.mark.parametrize("rho", [0.01, 1.0, 100.0])
def test_invariants_and_past_never_changes(rho, counter):
    rng = np.random.default_rng(int(rho * 100))
    panel = markov_bits(rng, 2000, 10)
    c = CumulativeSynthesizer(10, rho, seed=3, counter=counter)
    snaps = []
    for t in range(10):
        out = c.update(panel[:, t])
        assert out.shape == (2000, 1)
        np.testing.assert_array_equal(out[:, 0], np.asarray(c.synthetic)[:, t])
        snaps.append(np.asarray(c.synthetic).copy())
    check_invariants(c, snaps)
    assert c.m == 2000 and c.synthetic.shape == (2000, 10) and not c.synthetic.flags.writeable


@pytest.mark.parametrize("counter", COUNTERS)
def test_counts_path_equals_values_path(counter):
    panel = markov_bits(np.random.default_rng(5), 3000, 9)
    v = CumulativeSynthesizer(9, 0.05, seed=21, counter=counter)
    k = CumulativeSynthesizer(9, 0.05, seed=21, n=3000, counter=counter)
    for t in range(1, 10):
        np.testing.assert_array_equal(v.update(panel[:, t - 1]), k.release_counts(z_counts(panel, t)))
    np.testing.assert_array_equal(v.synthetic, k.synthetic)
    for t in range(1, 10):
        np.testing.assert_array_equal(v.noisy_counts[t], k.noisy_counts[t])
        np.testing.assert_array_equal(v.monotone_counts[t], k.monotone_counts[t])


@pytest.mark.parametrize("counter", COUNTERS)
@pytest.mark.parametrize("cut", [0, 1, 4, 8])
def test_state_round_trip_bit_for_bit(cut, counter):
    T = 9
    panel = markov_bits(np.random.default_rng(cut), 1500, T)
    ref = CumulativeSynthesizer(T, 0.05, seed=77, counter=counter)
    ref_out = [ref.update(panel[:, t]) for t in range(T)]
    c = CumulativeSynthesizer(T, 0.05, seed=77, counter=counter)
    for t in range(cut):
        c.update(panel[:, t])
    blob = dumps_state(c.get_state())
    assert dumps_state(c.get_state()) == blob
    r = CumulativeSynthesizer.from_state(loads_state(blob))
    assert r.counter == counter
    for t in range(cut, T):
        np.testing.assert_array_equal(r.update(panel[:, t]), ref_out[t])
    np.testing.assert_array_equal(r.synthetic, ref.synthetic)
    for t in range(1, T + 1):
        np.testing.assert_array_equal(r.noisy_counts[t], ref.noisy_counts[t])
        np.testing.assert_array_equal(r.monotone_counts[t], ref.monotone_counts[t])


def test_state_round_trip_counts_path():
    T = 6
    panel = markov_bits(np.random.default_rng(9), 500, T)
    ref = CumulativeSynthesizer(T, 0.05, seed=5, n=500)
    outs = [ref.release_counts(z_counts(panel, t)) for t in range(1, T + 1)]
    c = CumulativeSynthesizer(T, 0.05, seed=5, n=500)
    for t in range(1, 4):
        c.release_counts(z_counts(panel, t))
    r = CumulativeSynthesizer.from_state(loads_state(dumps_state(c.get_state())))
    for t in range(4, T + 1):
        np.testing.assert_array_equal(r.release_counts(z_counts(panel, t)), outs[t - 1])


@pytest.mark.parametrize("counter", COUNTERS)
def test_synthetic_index_set_uses_synthetic_weights(counter):
    # With enormous ρ the counts are essentially exact; the synthetic records must still be
    # drawn from the *synthetic* weight classes (Algorithm 2's text, x̂), so the synthetic
    # weight histogram matches the real one while individual rows are not the real rows.
    rng = np.random.default_rng(0)
    panel = markov_bits(rng, 4000, 8)
    c = CumulativeSynthesizer(8, 1e9, seed=1, counter=counter)
    for t in range(8):
        c.update(panel[:, t])
    syn = np.asarray(c.synthetic).astype(np.int64)
    np.testing.assert_array_equal(c.monotone_counts[8], true_counts(panel)[-1])
    np.testing.assert_array_equal(np.sort(syn.sum(axis=1)), np.sort(panel.sum(axis=1)))
    assert (syn != panel).any(axis=1).mean() > 0.1


# ------------------------------------------------------------------------------------------
# Lemma 4.2, Corollary B.1, counter variance (paper's simulated size: T = 12, ρ = 0.005)
# ------------------------------------------------------------------------------------------

# RUNS: every check below holds for any number of i.i.d. runs, so 100 (not 200) keeps their meaning at
# half the time (the noise sampler's per-call cost dominates: 12 steps × up to 12 counters a run).
# Lemma 4.2 is checked deterministically on every run. Corollary B.1 asks ≥ 1 − β* of the runs inside
# a bound that fails with probability ≤ β* per run. The variance check compares mean(Q) with 1 within
# Z_TOL standard errors estimated from the runs (sd(Q)/√RUNS), and itself asserts that a factor 2 either
# way is rejected at this RUNS (its power); the mean-zero check is a z-test per cell, 78 cells at
# Z_TOL = 4.5 (family-wise false alarm < 78·P(|t_99| > 4.5) ≈ 1.4e-3 for a correct mechanism).
N_USERS, HORIZON, RHO, RUNS = 5_000, 12, 0.005, 100
BETA_STAR = 0.05


@pytest.fixture(scope="module", params=COUNTERS)
def cumulative_runs(request):
    counter = request.param
    rng = np.random.default_rng(12)
    panels = {
        "all_ones": np.ones((N_USERS, HORIZON), dtype=np.int64),
        "markov": markov_bits(rng, N_USERS, HORIZON, p_on=0.3, stay=0.85),
    }
    out = {}
    for name, panel in panels.items():
        S = true_counts(panel)
        noisy, mono = [], []
        for r in range(RUNS):
            # β = β*/T so that Corollary B.1's β* = Tβ is 0.05
            c = CumulativeSynthesizer(HORIZON, RHO, beta=BETA_STAR / HORIZON, seed=50_000 + 1000 * len(name) + r,
                                      counter=counter)
            for t in range(HORIZON):
                c.update(panel[:, t])
            noisy.append([c.noisy_counts[t] for t in range(1, HORIZON + 1)])
            mono.append([c.monotone_counts[t] for t in range(1, HORIZON + 1)])
            if r == 0:
                check_invariants(c)
        out[name] = (S, np.array(noisy), np.array(mono), c)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["all_ones", "markov"])
def test_lemma_4_2_holds_deterministically_on_every_run(cumulative_runs, name):
    S, noisy, mono, _ = cumulative_runs[name]
    T = HORIZON
    for r in range(noisy.shape[0]):
        S_hat = np.vstack([np.r_[N_USERS, np.zeros(T, dtype=np.int64)], mono[r]])  # row t = Ŝ^t, t = 0..T
        S_true = np.vstack([np.r_[N_USERS, np.zeros(T, dtype=np.int64)], S])
        for t in range(1, T + 1):
            for b in range(1, t + 1):
                lhs = abs(S_hat[t, b] - S_true[t, b])
                rhs = max(
                    abs(noisy[r, t - 1, b] - S_true[t, b]),
                    abs(S_hat[t - 1, b] - S_true[t - 1, b]),
                    abs(S_hat[t - 1, b - 1] - S_true[t - 1, b - 1]),
                )
                assert lhs <= rhs, (r, t, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["all_ones", "markov"])
def test_corollary_b1_error_bound(cumulative_runs, name):
    S, noisy, mono, c = cumulative_runs[name]
    err = np.abs(mono - S[None]).max(axis=(1, 2))  # max over (t, b) per run
    if c.counter == "factorization":
        # re-derived Corollary B.1 (cell-by-cell union bound over the counters' variances, + 1/2 of
        # rounding) holds on ≥ 1 − β* of the runs; the noise scale itself is checked, with power
        # against a factor 2 in variance, by test_counter_error_variance_matches_counter
        assert (err <= c.error_bound(BETA_STAR)).mean() >= 1 - BETA_STAR
        return
    # Corollary B.1 as printed: n·α* = √(Σ_b w_b/ρ · ln(1/β)) with β* = Tβ = 0.05
    alpha_star = c.paper_alpha_star()
    assert alpha_star == pytest.approx(math.sqrt(counter_weights(HORIZON).sum() / RHO * math.log(HORIZON / BETA_STAR)))
    assert (err <= alpha_star).mean() >= 1 - BETA_STAR, ((err <= alpha_star).mean(), alpha_star)
    # the bound recomputed from the counters' exact variances (rigorous union bound), β = 0.05
    assert (err <= c.error_bound(BETA_STAR)).mean() >= 1 - BETA_STAR


@pytest.mark.slow
def test_counter_error_variance_matches_counter(cumulative_runs):
    """S̃_b^t − S_b^t is a linear combination of independent N_Z(0, σ_b²) draws (tree: popcount
    nodes; factorization: row t of A C_int⁻¹), so its variance is variance_at(t − b + 1) (up to
    Var(N_Z) < σ², relatively < 1e-6 here, and the factorization's rounding, < 1/4 absolute against
    variances of hundreds). Per run,
    Q = mean over all (b, t) cells of e²/variance_at; runs are i.i.d., so mean(Q) is compared with
    1 within Z_TOL standard errors (sd(Q)/√runs, estimated), and must reject a factor 2 either way."""
    for name, (S, noisy, _, c) in cumulative_runs.items():
        T = HORIZON
        cells = [(b, t) for b in range(1, T + 1) for t in range(b, T + 1)]
        var = np.array([c.counter_variance(b, t) for b, t in cells])
        e = np.array([[noisy[r, t - 1, b] - S[t - 1, b] for b, t in cells] for r in range(noisy.shape[0])], dtype=float)
        q = (e**2 / var).mean(axis=1)
        mean, se = q.mean(), q.std(ddof=1) / math.sqrt(q.size)
        assert abs(mean - 1) <= Z_TOL * se, (name, mean, se)
        assert abs(mean - 2) > Z_TOL * se and abs(mean - 0.5) > Z_TOL * se
        # the mean error is 0 (symmetric noise)
        z = e.mean(axis=0) / (e.std(axis=0, ddof=1) / math.sqrt(e.shape[0]))
        assert np.all(np.abs(z) <= Z_TOL)


@pytest.mark.parametrize("counter", COUNTERS)
def test_tiny_populations_and_extreme_budgets_never_crash(counter):
    rng = np.random.default_rng(1)
    for i in range(60):
        T, n = int(rng.integers(1, 8)), int(rng.integers(1, 6))
        c = CumulativeSynthesizer(T, float(10 ** rng.uniform(-3, 2)), seed=i, counter=counter)
        panel = rng.integers(0, 2, (n, T))
        for t in range(T):
            c.update(panel[:, t])
        check_invariants(c)
        assert c.t == T
