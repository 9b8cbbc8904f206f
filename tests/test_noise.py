"""Tests for pipeline.privacy.noise: exact discrete Gaussian and discrete Laplace samplers.

Statistical tests compare samples with the exact pmf of the parameter actually used
(``exact_sigma2`` / ``exact_scale``). On the seeded path seeds are fixed, so those tests are
deterministic. On the secure path (rng=None) the draws are fresh every run: a test fails only when
p < 1e-6, so a correct sampler fails a given test with probability 1e-6 (about 2e-5 for the whole
file), while the power test below shows the same procedure rejects a √2 error in the scale.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from pipeline.privacy import noise
from pipeline.privacy.noise import discrete_gaussian, discrete_laplace, exact_scale, exact_sigma2
from pipeline.privacy.rng import SecureRandom, SeededRandom

P_FAIL = 1e-6  # significance level of every statistical test in this file
N = 200_000  # samples per goodness-of-fit test
Z = 6.0  # |z| > 6 has two-sided probability 2e-9 under the normal approximation


# ------------------------------------------------------------------------------------------
# exact pmfs and the chi-square procedure
# ------------------------------------------------------------------------------------------
def gaussian_pmf(sigma2: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of N_Z(0, σ²) on |x| ≤ 14σ + 30 (the mass outside is below 1e-40)."""
    half = int(14 * math.sqrt(sigma2)) + 30
    xs = np.arange(-half, half + 1)
    w = np.exp(-(xs.astype(np.float64) ** 2) / (2 * sigma2))
    return xs, w / w.sum()


def laplace_pmf(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of the discrete Laplace on |x| ≤ 100·scale + 30 (outside mass < e^-100)."""
    half = int(100 * scale) + 30
    xs = np.arange(-half, half + 1)
    w = np.exp(-np.abs(xs).astype(np.float64) / scale)
    return xs, w / w.sum()


def chi_square_p(samples: np.ndarray, xs: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square goodness-of-fit p-value. Consecutive support points are merged left to right
    into bins with expected count ≥ 5 (so tails are pooled); samples beyond the support fall into
    the end bins, which extend to ±infinity."""
    n = samples.size
    target = max(5.0, n / 400)  # at most ~400 bins, each with expected count ≥ 5
    edges, acc = [], 0.0
    expected = []
    for x, p in zip(xs, pmf):
        acc += p * n
        if acc >= target:
            edges.append(x)
            expected.append(acc)
            acc = 0.0
    expected[-1] += acc  # remainder joins the last bin
    edges[-1] = xs[-1]
    idx = np.searchsorted(np.asarray(edges), samples, side="left")
    idx = np.minimum(idx, len(edges) - 1)
    observed = np.bincount(idx, minlength=len(edges))
    expected = np.asarray(expected)
    expected *= n / expected.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(stat, len(edges) - 1))


def moments(xs: np.ndarray, pmf: np.ndarray) -> tuple[float, float, float]:
    var = float((xs.astype(np.float64) ** 2 * pmf).sum())
    m4 = float((xs.astype(np.float64) ** 4 * pmf).sum())
    return 0.0, var, m4


RNGS = [pytest.param(None, id="secure"), pytest.param(20240917, id="seeded")]


# ------------------------------------------------------------------------------------------
# goodness of fit
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rng", RNGS)
@pytest.mark.parametrize("sigma2", [0.1, 1, 2, 37.5, 1e6])  # σ² = 2: γ(y) is an integer for odd |y|
def test_discrete_gaussian_matches_pmf(sigma2, rng):
    x = discrete_gaussian(sigma2, N, rng=rng)
    xs, pmf = gaussian_pmf(float(exact_sigma2(sigma2)))
    assert chi_square_p(x, xs, pmf) > P_FAIL


@pytest.mark.parametrize("rng", RNGS)
@pytest.mark.parametrize("scale", [0.3, 1, 7.5, 1000])
def test_discrete_laplace_matches_pmf(scale, rng):
    x = discrete_laplace(scale, N, rng=rng)
    xs, pmf = laplace_pmf(float(exact_scale(scale)))
    assert chi_square_p(x, xs, pmf) > P_FAIL


@pytest.mark.parametrize("sigma2", [1, 37.5, 1e6])
def test_chi_square_rejects_wrong_gaussian_scale(sigma2):
    """The goodness-of-fit procedure has power: samples of N_Z(0, 2σ²) are rejected against the
    pmf of N_Z(0, σ²), and the same procedure accepts N_Z(0, σ²) itself (test above)."""
    x = discrete_gaussian(2 * sigma2, N, rng=7)
    xs, pmf = gaussian_pmf(float(sigma2))
    assert chi_square_p(x, xs, pmf) < P_FAIL


@pytest.mark.parametrize("scale", [1, 1000])
def test_chi_square_rejects_wrong_laplace_scale(scale):
    x = discrete_laplace(scale * math.sqrt(2), N, rng=7)
    xs, pmf = laplace_pmf(float(scale))
    assert chi_square_p(x, xs, pmf) < P_FAIL


def test_huge_sigma2_binned():
    """σ² = 1e12: the pmf has ~1e7 relevant points, so compare bins of width σ/2 with the normal
    distribution's bin masses (edges at half-integers). By Poisson summation, those agree with the
    discrete Gaussian's to relative error ~exp(−2π²σ²), i.e. exactly in double precision."""
    sigma2 = 1e12
    x = discrete_gaussian(sigma2, 100_000, rng=None)
    assert x.dtype == np.int64
    sigma = math.sqrt(sigma2)
    edges = np.arange(-8, 8.5, 0.5) * sigma + 0.5
    cdf = stats.norm.cdf(edges / sigma)
    probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    observed = np.bincount(np.searchsorted(edges, x, side="right"), minlength=probs.size)
    expected = probs * x.size
    keep = expected >= 5
    obs = np.concatenate([observed[keep], [observed[~keep].sum()]])
    exp = np.concatenate([expected[keep], [expected[~keep].sum()]])
    stat = ((obs - exp) ** 2 / exp).sum()
    assert stats.chi2.sf(stat, obs.size - 1) > P_FAIL
    # and the spread is right: Var = σ² (to 1e-12 relative), sd of the sample variance ≈ σ²·√(2/n)
    assert abs(x.var() - sigma2) < Z * sigma2 * math.sqrt(2 / x.size)


# ------------------------------------------------------------------------------------------
# moments
# ------------------------------------------------------------------------------------------
def _check_moments(x: np.ndarray, xs: np.ndarray, pmf: np.ndarray) -> None:
    # The sample mean has sd √(Var/n); the sample second moment has sd √((m4 − Var²)/n). Both are
    # averages of n i.i.d. terms with finite moments, so |z| > 6 has probability ~2e-9 (CLT).
    mean, var, m4 = moments(xs, pmf)
    n = x.size
    xf = x.astype(np.float64)
    assert abs(xf.mean() - mean) < Z * math.sqrt(var / n)
    assert abs((xf**2).mean() - var) < Z * math.sqrt((m4 - var**2) / n)


@pytest.mark.parametrize("rng", RNGS)
@pytest.mark.parametrize("sigma2", [0.1, 2.5, 1000])
def test_discrete_gaussian_mean_and_variance(sigma2, rng):
    xs, pmf = gaussian_pmf(float(exact_sigma2(sigma2)))
    _check_moments(discrete_gaussian(sigma2, N, rng=rng), xs, pmf)


@pytest.mark.parametrize("rng", RNGS)
@pytest.mark.parametrize("scale", [0.5, 10])
def test_discrete_laplace_mean_and_variance(scale, rng):
    xs, pmf = laplace_pmf(float(exact_scale(scale)))
    _check_moments(discrete_laplace(scale, N, rng=rng), xs, pmf)


# ------------------------------------------------------------------------------------------
# the exact resolution path
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ubits", [3, 16])
def test_exact_resolution_path_keeps_distribution(monkeypatch, ubits):
    """Drive a large share of the Bernoulli draws through the exact Fraction path and check both
    samplers still match their pmfs. With 3-bit cells (ubits=3) a cell straddles p about a quarter
    of the time, so an error in the exact continuation shows up in the distribution; with 16-bit
    cells (the default) the float enclosures are widened (2**-4 instead of 2**-48) instead."""
    monkeypatch.setattr(noise, "_UBITS", ubits)
    if ubits == 16:
        monkeypatch.setattr(noise, "_REL_SLACK", 2.0**-4)
    calls = {"n": 0}
    real = noise._exact_bernoulli

    def counting(src, p):
        calls["n"] += 1
        return real(src, p)

    monkeypatch.setattr(noise, "_exact_bernoulli", counting)
    for sigma2 in (0.7, 2, 37.5):
        x = discrete_gaussian(sigma2, 30_000, rng=11)
        xs, pmf = gaussian_pmf(sigma2)
        assert chi_square_p(x, xs, pmf) > P_FAIL
    x = discrete_laplace(7.5, 30_000, rng=12)
    xs, pmf = laplace_pmf(7.5)
    assert chi_square_p(x, xs, pmf) > P_FAIL
    assert calls["n"] > 1000  # the exact path really was exercised


@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(2**64 - 1, 2**64), Fraction(5, 7 * 2**70)])
def test_exact_bernoulli(p):
    src = SeededRandom(3)
    n = 20_000
    hits = sum(noise._exact_bernoulli(src, p) for _ in range(n))
    pf = float(p)
    assert abs(hits - n * pf) <= Z * math.sqrt(n * pf * (1 - pf)) + 1


def test_exact_bern_exp_frequencies():
    src = SeededRandom(4)
    n = 20_000
    for gamma in (Fraction(1, 3), Fraction(5, 2)):
        hits = sum(noise._exact_bern_exp(src, gamma) for _ in range(n))
        p = math.exp(-float(gamma))
        assert abs(hits - n * p) <= Z * math.sqrt(n * p * (1 - p))


def test_vectorised_bern_exp_frequencies():
    """Algorithm 1 on lanes with different γ: per-lane frequency of 1 is exp(−γ)."""
    pool = noise._Pool(SeededRandom(5))
    gammas = np.array([0.0, 0.25, 0.5, 1.0])
    reps = 50_000
    g = np.repeat(gammas, reps)
    cells = float(1 << noise._UBITS)
    lo, hi = g * cells * (1 - 2.0**-48), g * cells * (1 + 2.0**-48)
    res = noise._bern_exp_unit(pool, lo, hi, lambda i: Fraction(float(g[i])), g.size)
    freq = res.reshape(len(gammas), reps).mean(axis=1)
    p = np.exp(-gammas)
    assert np.all(np.abs(freq - p) <= Z * np.sqrt(p * (1 - p) / reps) + 1e-12)


# ------------------------------------------------------------------------------------------
# edge cases, parameters and errors
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rng", RNGS)
def test_tiny_sigma2_is_all_zeros(rng):
    # P(x ≠ 0) = 2·exp(−1/(2e-6))/Z ≈ 0: every draw must be 0.
    x = discrete_gaussian(1e-6, 100_000, rng=rng)
    assert x.dtype == np.int64 and x.shape == (100_000,)
    assert not x.any()


def test_small_sigma2_pmf_at_one():
    # σ² = 0.05: P(|x| = 1) = 2e^{-10}/(1 + 2e^{-10} + ...) ≈ 9.1e-5, so about 18 of 2e5.
    sigma2 = 0.05
    xs, pmf = gaussian_pmf(sigma2)
    x = discrete_gaussian(sigma2, N, rng=21)
    p1 = float(pmf[np.abs(xs) == 1].sum())
    k = int(np.count_nonzero(x))
    assert stats.binom.sf(k - 1, N, p1) > P_FAIL and stats.binom.cdf(k, N, p1) > P_FAIL
    assert set(np.unique(x)) <= {-1, 0, 1}


def test_huge_sigma2_extremes():
    x = discrete_gaussian(2.0**80, 1000, rng=1)
    assert x.dtype == np.int64 and np.abs(x).max() < 40 * 2.0**40


@pytest.mark.parametrize("fn", [discrete_gaussian, discrete_laplace])
def test_size_zero_and_dtype(fn):
    out = fn(3.0, 0, rng=1)
    assert out.dtype == np.int64 and out.shape == (0,)
    out = fn(3.0, 5, rng=None)
    assert out.dtype == np.int64 and out.shape == (5,)
    assert fn(3.0, np.int64(4), rng=1).shape == (4,)


@pytest.mark.parametrize("fn,name", [(discrete_gaussian, "sigma2"), (discrete_laplace, "scale")])
@pytest.mark.parametrize(
    "bad,exc",
    [(-1.0, ValueError), (0, ValueError), (0.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
     (Fraction(-1, 3), ValueError), ("1", TypeError), (None, TypeError), (True, TypeError), ([1.0], TypeError),
     (1e300, ValueError), (1e-300, ValueError)],
)
def test_bad_parameter(fn, name, bad, exc):
    with pytest.raises(exc, match=name):
        fn(bad, 3, rng=1)


@pytest.mark.parametrize("fn", [discrete_gaussian, discrete_laplace])
@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (2.0, TypeError), ("3", TypeError), (True, TypeError), (None, TypeError)])
def test_bad_size(fn, bad, exc):
    with pytest.raises(exc, match="size"):
        fn(1.0, bad, rng=1)


@pytest.mark.parametrize("fn", [discrete_gaussian, discrete_laplace])
def test_bad_rng(fn):
    with pytest.raises(TypeError, match="rng"):
        fn(1.0, 3, rng="seed")


def test_exact_parameters():
    assert exact_sigma2(0.1) == Fraction(0.1)  # floats are used exactly (dyadic)
    assert exact_sigma2(Fraction(1, 3)) == Fraction(1, 3)
    assert exact_sigma2(np.int64(7)) == 7
    assert exact_scale(7.5) == Fraction(15, 2)
    assert exact_scale(1000.0) == 1000 and exact_scale(2**50) == 2**50
    # 0.3 is m/2**54: its denominator exceeds 2**52, so it is rounded up by < 2**-48 relative
    assert Fraction(0.3) < exact_scale(0.3) < Fraction(0.3) * (1 + Fraction(1, 2**48))
    # numerator/denominator above 2**52: rounded up, by less than 2**-32 relative
    for s in (1e-6, Fraction(10**30 + 1, 10**28), Fraction(1, 3) + Fraction(1, 2**60)):
        e = exact_scale(s)
        assert e >= Fraction(s) and (e - Fraction(s)) / Fraction(s) < Fraction(1, 2**32)
        assert e.numerator <= 2**52 and e.denominator <= 2**52


def test_rational_parameters_match_pmf():
    x = discrete_gaussian(Fraction(10, 3), N, rng=31)
    assert chi_square_p(x, *gaussian_pmf(10 / 3)) > P_FAIL
    x = discrete_laplace(Fraction(7, 3), N, rng=32)
    assert chi_square_p(x, *laplace_pmf(7 / 3)) > P_FAIL


@pytest.mark.parametrize("fn", [discrete_gaussian, discrete_laplace])
def test_seeded_reproducible(fn):
    a = fn(12.5, 10_000, rng=99)
    b = fn(12.5, 10_000, rng=99)
    c = fn(12.5, 10_000, rng=100)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # a restored source state continues bit-for-bit
    src = SeededRandom(5)
    fn(12.5, 100, rng=src)
    state = src.get_state()
    first = fn(12.5, 1000, rng=src)
    src.set_state(state)
    assert np.array_equal(fn(12.5, 1000, rng=src), first)


@pytest.mark.parametrize("src", [SeededRandom(8), SecureRandom()], ids=["seeded", "secure"])
@pytest.mark.parametrize("fn", [discrete_gaussian, discrete_laplace])
def test_shared_source_advances(fn, src):
    # Two draws of 1000 values with variance ≥ 100 coincide with probability far below 1e-100.
    assert not np.array_equal(fn(100.0, 1000, rng=src), fn(100.0, 1000, rng=src))


def test_secure_calls_differ():
    assert not np.array_equal(discrete_gaussian(100.0, 1000), discrete_gaussian(100.0, 1000))


@pytest.mark.parametrize("t", [1, 3, 40_000, 65_536, 70_000, 3 * 2**30, 2**40 + 7])
def test_uniform_below(t):
    """U of Algorithm 2 is exactly uniform on [0, t). t = 40000 and 3·2**30 make plain modulo
    reduction visibly biased (2**16 mod 40000 = 25536), so this checks the rejection step."""
    pool = noise._Pool(SeededRandom(6))
    u = np.concatenate([noise._uniform_below(pool, t, 50_000) for _ in range(4)])
    assert u.dtype == np.int64 and u.size > 100_000  # rejection drops at most 40% here
    assert u.min() >= 0 and u.max() < t
    if t == 1:
        return
    bins = min(t, 50)
    width = -(-t // bins)
    sizes = np.array([min(width, t - b * width) for b in range(bins)], dtype=np.float64)
    observed = np.bincount(u // width, minlength=bins)
    assert stats.chisquare(observed, sizes / t * u.size).pvalue > P_FAIL


def test_sigma2_extremely_small_uses_exact_path_safely():
    # σ² = 2**-100: γ(±1) ≈ 2**99 lies beyond the float path's range (≥ 2**44); those lanes take
    # the exact branch after 2**44 Bernoulli(exp(−1)) trials, which they fail. All draws are 0.
    x = discrete_gaussian(Fraction(1, 2**100), 20_000, rng=3)
    assert not x.any()


def test_laplace_overflow_guard(monkeypatch):
    """X = U + t·V is checked against int64 before it is formed (V > 2**11 is needed, which has
    probability below exp(−2048); force it here)."""
    monkeypatch.setattr(noise, "_geometric_e1", lambda pool, n: np.full(n, 2**62, dtype=np.int64))
    with pytest.raises(OverflowError, match="int64"):
        discrete_laplace(10, 100, rng=1)
