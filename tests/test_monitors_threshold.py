"""AboveThreshold, ThresholdMonitor, ThresholdMonitorEvolving: behaviour, utility (Theorem 3.1),
noise law vs sampler, sparse vs dense step, state round trips."""

import math

import numpy as np
import pytest
from scipy import stats

from pipeline.monitors import AboveThreshold, ThresholdMonitor, ThresholdMonitorEvolving
from pipeline.serialization import dumps_state, loads_state

# small-noise internal parameters: b = ln(1000) ≈ 6.9, Δ ≈ 13.3, w ~ DL(133)
EPS_T, DELTA_T = 1.0, 1e-3


def _z_ok(hits_a, hits_b, runs, z=4.5):
    """Two-proportion z-test per cell (both samples of size ``runs``), pooled variance."""
    pa, pb = hits_a / runs, hits_b / runs
    pool = (hits_a + hits_b) / (2 * runs)
    se = np.sqrt(np.maximum(pool * (1 - pool), 1e-12) * 2 / runs)
    return np.abs(pa - pb) <= z * se + 1e-12


def _dl_pmf(s, xs):
    r = math.exp(-1 / s)
    return (1 - r) / (1 + r) * r ** np.abs(xs)


def test_above_threshold_halts_and_frequency_matches_exact_law():
    at = AboveThreshold(1.0, 10, seed=1)
    assert not at.query(-1000)
    assert at.query(1000)
    with pytest.raises(RuntimeError):
        at.query(0)
    assert at.privacy.epsilon == 1.0
    # P[⊤ on a query with value = t] = P[ν ≥ η], ν ~ DL(4/ε), η ~ DL(2/ε): brute force
    eps = 0.5
    xs = np.arange(-400, 401)
    p_nu, p_eta = _dl_pmf(4 / eps, xs), _dl_pmf(2 / eps, xs)
    exact = float(sum(p_eta[i] * p_nu[xs >= xs[i]].sum() for i in range(xs.size)))
    runs = 3000
    tops = sum(AboveThreshold(eps, 5, seed=100 + r).query(5) for r in range(runs))
    assert abs(tops / runs - exact) <= 4.5 * math.sqrt(exact * (1 - exact) / runs)


def test_threshold_monitor_counters_fractional_and_deletion_at_k():
    n = 4002
    mon = ThresholdMonitor(n, EPS_T, DELTA_T, threshold=2000, k=1, granularity=4, seed=2)
    contrib = np.ones(n)
    contrib[0], contrib[1] = 0.5, 0.25
    assert mon.query(contrib)  # ~4000 ≫ 2000 + noise
    assert mon.counters[0] == 2 and mon.counters[1] == 1 and np.all(mon.counters[2:] == 4)
    assert mon.active[:2].all() and not mon.active[2:].any()  # c ≥ k deleted
    # deleted records no longer count: the same query now sums 0.75
    assert not mon.query(contrib)
    assert mon.counters[0] == 2
    only_deleted = np.zeros(n)
    only_deleted[2:] = 1.0
    assert not mon.query(only_deleted)
    with pytest.raises(ValueError, match="contributions"):
        mon.query(np.full(n, 1.5))
    with pytest.raises(ValueError, match="contributions"):
        mon.query(np.ones(n - 1))


def test_threshold_monitor_privacy_is_theorem_3_2():
    mon = ThresholdMonitor(10, 0.01, 1e-6, threshold=5, k=3)
    xi = 75 * 4 * 0.01 / math.log(1e6) + 25 * 0.01
    assert mon.privacy("add_remove").epsilon == pytest.approx(xi)
    assert mon.privacy("add_remove").delta == pytest.approx(3e-6)
    tm = ThresholdMonitor.from_target(10, 1.0, 1e-6, threshold=5, k=3)
    assert tm.privacy("replace").epsilon == pytest.approx(1.0)


def test_noise_law_matches_sampler():
    mon = ThresholdMonitor(1, EPS_T, DELTA_T, threshold=0, k=1e9, seed=3)
    draws = mon._noise(40000)
    for y in (-150.0, 0.0, 13.0, 100.0, 300.0):
        exact = math.exp(mon.noise_law.log_sf(y))
        freq = float((draws >= y).mean())
        assert abs(freq - exact) <= 4.5 * math.sqrt(exact * (1 - exact) / draws.size) + 1e-9
    # the cap: v̄ ≤ Δ, so w + v̄ − w ≤ Δ; check P(noise ≥ y) is below P(w ≥ y − Δ)
    assert mon.big_delta == pytest.approx(math.log(1000) * math.log(math.log(1000)))


def test_theorem_3_1_utility_bounds():
    runs, m, beta = 100, 30, 0.1
    n = 3000
    probe = ThresholdMonitor(n, EPS_T, DELTA_T, threshold=1500, k=1e9)
    upper, lower = probe.utility_margins(m, beta)
    assert upper > 0 and lower > 0
    rng = np.random.default_rng(4)
    failures = 0
    for r in range(runs):
        mon = ThresholdMonitor(n, EPS_T, DELTA_T, threshold=1500, k=1e9, seed=1000 + r)
        bad = False
        for _ in range(m):
            f = int(rng.integers(max(0, 1500 - 2 * int(upper)), min(n, 1500 + 2 * int(lower)) + 1))
            contrib = np.zeros(n)
            contrib[:f] = 1.0
            top = mon.query(contrib)
            if (top and f <= 1500 - upper) or (not top and f >= 1500 + lower):
                bad = True
        failures += bad
    assert failures <= stats.binom.ppf(1 - 1e-4, runs, beta)


def _dense_step(mon: ThresholdMonitorEvolving, vals: np.ndarray, domain: int) -> np.ndarray:
    """The straightforward implementation: one query per element, in id order."""
    flags = []
    for x in range(domain):
        if mon.query((vals == x).astype(float)):
            flags.append(x)
    return np.array(flags, dtype=np.int64)


def test_tme_sparse_step_matches_dense_loop_in_distribution():
    domain, n, steps, runs, t = 10, 60, 2, 1000, 100
    # fixed data: elements 0..3 get 30, 15, 10, 5 users; 4..9 zero-count (step data shifts each step)
    base = np.repeat(np.arange(4), [30, 15, 10, 5])
    data = [np.roll(base, 7 * s) if s else base for s in range(steps)]
    data = [np.where(d == 3, 3 + s, d) for s, d in enumerate(data)]
    sparse = np.zeros((steps, domain))
    dense = np.zeros((steps, domain))
    for r in range(runs):
        a = ThresholdMonitorEvolving(n, EPS_T, DELTA_T, threshold=t, k=2, seed=10_000 + r)
        b = ThresholdMonitorEvolving(n, EPS_T, DELTA_T, threshold=t, k=2, seed=90_000 + r)
        for s in range(steps):
            sparse[s, a.query_all_elements(data[s], domain)] += 1
            dense[s, _dense_step(b, data[s], domain)] += 1
    assert _z_ok(sparse, dense, runs).all(), (sparse, dense)
    # a zero-count element at step 1 is flagged with the exact tail probability
    p0 = math.exp(ThresholdMonitorEvolving(n, EPS_T, DELTA_T, threshold=t, k=2).noise_law.log_sf(t))
    freq = sparse[0, 9] / runs
    assert abs(freq - p0) <= 4.5 * math.sqrt(p0 * (1 - p0) / runs)


def test_tme_users_retire_after_k_flags_and_stop_counting():
    n, domain = 3800, 50
    mon = ThresholdMonitorEvolving(n, EPS_T, DELTA_T, threshold=1400, k=2, seed=6)
    vals = np.zeros(n, dtype=np.int64)
    vals[2800:] = np.arange(1000) % 40 + 10  # background, weight 25 each
    for step in range(2):
        flagged = mon.query_all_elements(vals, domain)
        assert 0 in flagged  # 2800 = 1400 + 1400, noise scale ~133
    assert np.all(mon.counters[:2800] == 2) and not mon.active[:2800].any()
    assert mon.active[2800:].all()
    # the 2800 retired users no longer count: element 0 now has active count 0
    assert 0 not in mon.query_all_elements(vals, domain)


def test_tme_state_round_trip_bit_for_bit():
    n, domain = 500, 1000
    rng = np.random.default_rng(7)
    steps = [rng.integers(0, 20, n) for _ in range(6)]
    a = ThresholdMonitorEvolving(n, EPS_T, DELTA_T, threshold=120, k=2, seed=8)
    for s in steps[:3]:
        a.query_all_elements(s, domain)
    blob = dumps_state(a.get_state())
    b = ThresholdMonitorEvolving.from_state(loads_state(blob))
    assert dumps_state(b.get_state()) == blob
    for s in steps[3:]:
        assert np.array_equal(a.query_all_elements(s, domain), b.query_all_elements(s, domain))
    assert np.array_equal(a.counters, b.counters)
    assert dumps_state(a.get_state()) == dumps_state(b.get_state())


def test_tme_argument_errors():
    with pytest.raises(ValueError, match="delta"):
        ThresholdMonitorEvolving(5, 1.0, 1.5, threshold=1, k=1)
    with pytest.raises(TypeError, match="n_records"):
        ThresholdMonitorEvolving(5.5, 1.0, 0.1, threshold=1, k=1)
    mon = ThresholdMonitorEvolving(5, EPS_T, DELTA_T, threshold=1, k=1)
    with pytest.raises(ValueError, match="values"):
        mon.query_all_elements(np.array([0, 1, 2, 3, 9]), 5)
    with pytest.raises(ValueError, match="domain_size"):
        mon.query_all_elements(np.zeros(5, dtype=int), 0)
