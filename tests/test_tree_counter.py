"""Tests for pipeline.counters.tree (binary tree mechanism, Bun et al. 2024, Algorithm 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pipeline.counters.tree import (
    HorizonExceededError,
    TreeCounter,
    released_nodes,
    tree_levels,
    tree_sigma2,
)
from pipeline.privacy.rng import SecureRandom, SeededRandom
from pipeline.serialization import dumps_state, loads_state

HORIZONS = [1, 2, 3, 7, 8, 12, 100, 1024, 1000]


def _dyadic_nodes_closing_by(T):
    """Independent enumeration, level by level: [(k−1)2^i + 1, k·2^i] for k·2^i ≤ T and k odd.

    A node with k even closes at the same step as its parent, which absorbs it (Algorithm 3 releases
    one node per step, the one at the step's lowest set bit), so only odd k are ever released.
    """
    nodes = set()
    i = 0
    while (1 << i) <= T:
        w = 1 << i
        for k in range(1, T // w + 1, 2):
            nodes.add((i, (k - 1) * w + 1, k * w))
        i += 1
    return nodes


def _leaf_membership(T):
    """count[s] = number of released nodes containing leaf s (s = 1..T)."""
    diff = np.zeros(T + 2, dtype=np.int64)
    for _, a, b in _dyadic_nodes_closing_by(T):
        diff[a] += 1
        diff[b + 1] -= 1
    return np.cumsum(diff)[1 : T + 1]


def _discrete_gaussian_variance(sigma2):
    """Exact Var of N_Z(0, σ²) by summing its pmf (tails beyond 40σ are < 1e-300)."""
    r = int(40 * math.sqrt(sigma2)) + 2
    x = np.arange(-r, r + 1, dtype=np.float64)
    w = np.exp(-(x**2) / (2 * sigma2))
    return float(np.sum(x**2 * w) / np.sum(w))


# -------------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("T", HORIZONS)
def test_released_nodes_are_the_dyadic_nodes_closing_by_T(T):
    assert set(released_nodes(T)) == _dyadic_nodes_closing_by(T)
    assert len(released_nodes(T)) == T  # one node closes per step


@pytest.mark.parametrize("T", HORIZONS)
def test_privacy_calibration_add_remove(T):
    rho = 0.37
    c = TreeCounter(T, rho, seed=0)
    counts = _leaf_membership(T)
    assert c.levels == tree_levels(T) == counts.max()  # worst leaf is in exactly L released nodes
    assert c.levels == math.floor(math.log2(T)) + 1
    assert c.node_rho == pytest.approx(1 / (2 * c.sigma2), rel=1e-15)
    assert c.node_rho == pytest.approx(rho / c.levels, rel=1e-15)
    # a leaf's increment changes each node containing it by ≤ 1: cost = Σ 1/(2σ²) over those nodes
    per_leaf = counts / (2 * c.sigma2)
    assert np.all(per_leaf <= rho * (1 + 1e-12))
    assert per_leaf.max() == pytest.approx(rho, rel=1e-12)


@pytest.mark.parametrize("T", [8, 12, 1024, 1000])
def test_paper_log_T_calibration_would_overspend(T):
    # σ² = log2(T)/(2ρ) (the most generous reading of the paper's log T) is not ρ-zCDP here
    rho = 1.0
    worst = _leaf_membership(T).max()
    assert worst / (2 * math.log2(T) / (2 * rho)) > rho
    assert worst / (2 * tree_sigma2(T, rho)) == pytest.approx(rho)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 12, 33, 64])
def test_privacy_calibration_replace(T):
    rho = 0.5
    c = TreeCounter(T, rho, seed=0, neighbours="replace")
    assert c.sigma2 == pytest.approx(2 * tree_sigma2(T, rho, "add_remove"), rel=1e-15)
    nodes = list(_dyadic_nodes_closing_by(T))
    member = np.array([[a <= s <= b for (_, a, b) in nodes] for s in range(1, T + 1)])
    # one leaf −1 and another +1: nodes holding both are unchanged, the others change by 1
    worst = member.sum(axis=1).max()
    for a in range(T):
        sym = np.logical_xor(member[a], member).sum(axis=1)
        worst = max(worst, sym.max())
    assert worst / (2 * c.sigma2) <= rho * (1 + 1e-12)


# -------------------------------------------------------------------------------- noise variance


def test_error_variance_matches_popcount_sigma2():
    """Monte Carlo over M independent counters (width=M) with a chi-square tolerance.

    For each t the errors S̃_t − S_t of the M counters are iid with variance
    v_t = popcount(t)·Var(N_Z(0, σ²)) and (near-)normal, so (M−1)s²/v_t ~ χ²_{M−1}. Each t is
    tested two-sided at level 1e-6/T (Bonferroni over t: the whole test fails spuriously with
    probability ≤ 1e-6). The same statistic must reject v_t/2 and 2·v_t at every t, so a factor-2
    error in the calibration cannot pass.
    """
    T, M, sigma2 = 16, 20000, 4.0
    rho = tree_levels(T) / (2 * sigma2)
    counter = TreeCounter(T, rho, seed=20240611, width=M)
    assert counter.sigma2 == pytest.approx(sigma2)
    data = np.random.default_rng(7).integers(-5, 6, size=(T, M))
    truth = np.cumsum(data, axis=0)
    errors = np.stack([counter.update(data[t]) for t in range(T)]) - truth
    var1 = _discrete_gaussian_variance(sigma2)
    alpha = 1e-6 / T
    lo, hi = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], M - 1)
    for t in range(1, T + 1):
        v = bin(t).count("1") * var1
        assert counter.variance_at(t) == pytest.approx(bin(t).count("1") * sigma2)
        assert v <= counter.variance_at(t) * (1 + 1e-12)  # discrete Gaussian variance ≤ σ²
        s2 = errors[t - 1].var(ddof=1)
        assert lo <= (M - 1) * s2 / v <= hi, (t, s2, v)
        for wrong in (v / 2, 2 * v):
            assert not lo <= (M - 1) * s2 / wrong <= hi, (t, s2, wrong)
        # unbiased: |mean| within 5.3 standard errors (two-sided 1e-7)
        assert abs(errors[t - 1].mean()) <= 5.3 * math.sqrt(v / M)


def test_scalar_counter_draws_like_one_column():
    a = TreeCounter(37, 0.2, seed=11)
    b = TreeCounter(37, 0.2, seed=11, width=1)
    zs = np.random.default_rng(3).integers(0, 50, size=37)
    for z in zs:
        out_a = a.update(int(z))
        out_b = b.update(np.array([z]))
        assert isinstance(out_a, int)
        assert out_b.shape == (1,) and out_a == int(out_b[0])


# -------------------------------------------------------------------------------- structure


@pytest.mark.parametrize("T", [1, 7, 8, 100])
def test_prefix_sums_exact_without_noise(T):
    counter = TreeCounter(T, 1e15, seed=5)  # σ² ≈ L·5e-16: P(any nonzero draw) is astronomically small
    z = np.random.default_rng(T).integers(-10**6, 10**6, size=T)
    out = [counter.update(int(v)) for v in z]
    assert out == [int(s) for s in np.cumsum(z)]


def test_error_is_sum_of_released_node_noise(monkeypatch):
    """Replace the sampler by a recorder: the k-th draw (at step k) is 1000·k. Then S̃_t − S_t must be
    the sum of the draws of the nodes of t's dyadic decomposition, i.e. of the steps t with its low
    bits cleared — all ≤ t, so only released nodes are used."""
    import pipeline.privacy.noise as noise

    calls = []

    def fake(sigma2, size, rng=None):
        calls.append(sigma2)
        return np.full(size, 1000 * len(calls), dtype=np.int64)

    monkeypatch.setattr(noise, "discrete_gaussian", fake)
    T = 45
    counter = TreeCounter(T, 0.3, seed=1)
    z = np.random.default_rng(0).integers(0, 9, size=T)
    for t in range(1, T + 1):
        out = counter.update(int(z[t - 1]))
        closers = [t & ~((1 << j) - 1) for j in range(t.bit_length()) if (t >> j) & 1]
        assert out - int(z[:t].sum()) == sum(1000 * c for c in closers)
        assert len(calls) == t  # one draw per step: each node's noise is drawn once
    assert set(calls) == {counter.sigma2}


def test_outputs_do_not_depend_on_future_increments():
    T, k = 50, 23
    rng = np.random.default_rng(9)
    z1 = rng.integers(0, 100, size=T)
    z2 = z1.copy()
    z2[k:] = rng.integers(0, 100, size=T - k)
    a, b = TreeCounter(T, 0.1, seed=4), TreeCounter(T, 0.1, seed=4)
    out_a = [a.update(int(v)) for v in z1]
    out_b = [b.update(int(v)) for v in z2]
    assert out_a[:k] == out_b[:k]
    assert out_a[k:] != out_b[k:]


# -------------------------------------------------------------------------------- state


@pytest.mark.parametrize("width", [None, 5])
@pytest.mark.parametrize("k", [0, 1, 6, 8, 29, 30])
def test_state_round_trip_continues_bit_for_bit(width, k):
    T = 30
    shape = (T,) if width is None else (T, width)
    z = np.random.default_rng(k).integers(0, 20, size=shape)
    ref = TreeCounter(T, 0.05, seed=99, width=width)
    ref_out = [ref.update(z[t] if width else int(z[t])) for t in range(T)]

    c = TreeCounter(T, 0.05, seed=99, width=width)
    out = [c.update(z[t] if width else int(z[t])) for t in range(k)]
    blob = dumps_state(c.get_state())
    restored = TreeCounter.from_state(loads_state(blob))
    assert dumps_state(restored.get_state()) == blob
    out += [restored.update(z[t] if width else int(z[t])) for t in range(k, T)]
    assert [np.asarray(o).tolist() for o in out] == [np.asarray(o).tolist() for o in ref_out]


def test_state_with_shared_random_source():
    shared = SeededRandom(5)
    a, b = TreeCounter(10, 0.1, seed=shared), TreeCounter(6, 0.2, seed=shared)
    ref_shared = SeededRandom(5)
    ra, rb = TreeCounter(10, 0.1, seed=ref_shared), TreeCounter(6, 0.2, seed=ref_shared)
    expected = [(ra.update(t), rb.update(2 * t)) for t in range(1, 7)]
    got = [(a.update(t), b.update(2 * t)) for t in range(1, 4)]
    sa, sb = a.get_state(include_rng=False), b.get_state(include_rng=False)
    assert sa["rng"] is None
    with pytest.raises(ValueError, match="rng"):
        TreeCounter.from_state(sa)
    src = SeededRandom(0)
    src.set_state(shared.get_state())
    a2, b2 = TreeCounter.from_state(sa, rng=src), TreeCounter.from_state(sb, rng=src)
    assert a2.rng is b2.rng
    got += [(a2.update(t), b2.update(2 * t)) for t in range(4, 7)]
    assert got == expected


def test_restore_never_redraws_released_noise():
    c = TreeCounter(20, 0.01, seed=None)  # secure source: nothing can be replayed
    assert isinstance(c.rng, SecureRandom)
    outs = [c.update(3) for _ in range(7)]
    state = loads_state(dumps_state(c.get_state()))
    for _ in range(3):
        r = TreeCounter.from_state(state)
        assert r.value == outs[-1] and r.t == 7
        np.testing.assert_array_equal(r.get_state()["alpha_noisy"], state["alpha_noisy"])


def test_from_state_rejects_tampered_state():
    state = TreeCounter(8, 0.1, seed=1).get_state()
    bad = dict(state, sigma2=state["sigma2"] * 2)
    with pytest.raises(ValueError, match="sigma2"):
        TreeCounter.from_state(bad)
    with pytest.raises(ValueError, match="alpha"):
        TreeCounter.from_state(dict(state, alpha=np.zeros(3, dtype=np.int64)))
    with pytest.raises(ValueError, match="kind"):
        TreeCounter.from_state(dict(state, kind="other"))


# -------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(horizon=0, rho=1.0), ValueError, "horizon"),
        (dict(horizon=-3, rho=1.0), ValueError, "horizon"),
        (dict(horizon=2.5, rho=1.0), TypeError, "horizon"),
        (dict(horizon=True, rho=1.0), TypeError, "horizon"),
        (dict(horizon=4, rho=0.0), ValueError, "rho"),
        (dict(horizon=4, rho=-1.0), ValueError, "rho"),
        (dict(horizon=4, rho=float("nan")), ValueError, "rho"),
        (dict(horizon=4, rho=float("inf")), ValueError, "rho"),
        (dict(horizon=4, rho="1"), TypeError, "rho"),
        (dict(horizon=4, rho=1.0, neighbours="swap"), ValueError, "neighbours"),
        (dict(horizon=4, rho=1.0, width=0), ValueError, "width"),
        (dict(horizon=4, rho=1.0, seed=1.5), TypeError, "rng"),
        (dict(horizon=4, rho=1e40), ValueError, "rho"),  # σ² below the sampler's range
    ],
)
def test_constructor_errors_name_argument(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        TreeCounter(**kwargs)


def test_update_errors():
    c = TreeCounter(2, 1.0, seed=0)
    for bad in (1.0, np.float64(2.0), True, "3", None):
        with pytest.raises(TypeError, match="z"):
            c.update(bad)
    with pytest.raises(ValueError, match="z"):
        c.update(2**63)
    assert c.t == 0  # refused updates consume nothing
    c.update(np.int32(4))
    c.update(-7)
    with pytest.raises(HorizonExceededError, match="horizon"):
        c.update(1)
    with pytest.raises(ValueError, match="t"):
        c.variance_at(3)
    v = TreeCounter(4, 1.0, seed=0, width=3)
    with pytest.raises(TypeError, match="z"):
        v.update(np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="shape"):
        v.update(np.array([1, 2]))


def test_overflow_is_refused_not_wrapped():
    c = TreeCounter(4, 1e15, seed=0)
    c.update(2**62)
    with pytest.raises(OverflowError):
        c.update(2**62)  # node [1,2] would hold 2^63
    assert c.t == 1 and c.value == 2**62
    n = TreeCounter(4, 1e15, seed=0)
    n.update(-(2**63))
    with pytest.raises(OverflowError):
        n.update(-1)
    v = TreeCounter(2, 1e15, seed=0, width=2)
    v.update(np.array([2**62, 1]))
    with pytest.raises(OverflowError):
        v.update(np.array([2**62, 1]))
