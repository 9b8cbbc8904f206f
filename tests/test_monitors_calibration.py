"""Calibration round trips, the target-charging accountant (notes/tct.md §3 vectors), exact tails of
the noise laws, and the sparse-sampling primitives."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from pipeline.monitors import calibration as cal
from pipeline.privacy.laws import (
    CappedSumLaw,
    DiscreteGaussianLaw,
    DiscreteLaplaceLaw,
    binomial_draw,
    choose_absent_ids,
    geometric_draw,
    lower_quantile,
    upper_quantile,
)
from pipeline.privacy.exact import Interval, exact_probability
from pipeline.privacy.conversions import zcdp_to_approx_dp
from pipeline.privacy.rng import RandomSource, as_random_source

from composition_support import direct_epsilon

# ---------------------------------------------------------------------------------------------
# notes/tct.md §3 test vectors
# ---------------------------------------------------------------------------------------------


def test_not_prior_q_and_cost_per_hit():
    q = cal.not_prior_q(0.1)
    assert round(q, 4) == 0.4750
    assert round(0.1 / q, 3) == 0.211


def test_accountant_vectors_at_eps_0_1_tau_50():
    acc = cal.TargetChargingAccountant(0.1, 50)
    assert round(acc.r(1.0), 1) == 210.5
    assert round(acc.basic(1.0, exact=False).epsilon, 2) == 21.05
    adv = acc.advanced(1.0, 1e-6, exact=False)
    assert round(adv.epsilon, 2) == 8.68
    assert f"{acc.delta_star(1.0, exact=False):.1e}" == "3.7e-06"
    # advanced total delta = delta + delta*
    assert adv.delta == pytest.approx(1e-6 + acc.delta_star(1.0, exact=False))
    # the exact Binomial tail is the quantity the proof bounds: never above Chernoff
    for alpha in (0.2, 0.5, 1.0, 3.0):
        assert acc.delta_star(alpha, exact=True) <= acc.delta_star(alpha, exact=False)


def _calls_beyond(r: float, tau: int, q: float) -> float:
    """P[X > r], X = Bernoulli(q) trials until the τ-th success (the data holder's calls in the
    simulation of Theorem B.4), from the negative binomial law of the failures X − τ: independent
    of the Binomial form the accountant uses."""
    return float(stats.nbinom.sf(math.floor(r) - tau, tau, q))


def test_exact_delta_star_is_the_binomial_tail():
    # δ* = P[X > r] = P[Bin(⌊r⌋, q) < τ]; the proof of Theorem B.4 writes 1 + ⌊r⌋ trials, which is
    # P[X > ⌊r⌋ + 1] and pairs one call too many with the charge r·ε.
    acc = cal.TargetChargingAccountant(0.5, 3)
    alpha = 2.0
    m = math.floor((1 + alpha) * 3 / acc.q)
    # P[Bin(m, q) < 3] by direct summation in exact arithmetic
    q = Fraction(acc.q)
    direct = float(sum(math.comb(m, j) * q**j * (1 - q) ** (m - j) for j in range(3)))
    assert acc.delta_star(alpha) == pytest.approx(direct, rel=1e-10)
    assert acc.delta_star(alpha) == pytest.approx(_calls_beyond(acc.r(alpha), 3, acc.q), rel=1e-10)


@pytest.mark.parametrize("eps0,tau", [(0.1, 50), (0.5, 3), (0.05, 10), (0.3, 6)])
def test_delta_star_is_the_probability_of_more_than_r_calls(eps0, tau):
    acc = cal.TargetChargingAccountant(eps0, tau)
    for alpha in (0.3, 1.0, 2.5, 7.0):
        assert acc.delta_star(alpha) == pytest.approx(_calls_beyond(acc.r(alpha), tau, acc.q), rel=1e-9)
        # the Chernoff bound of Theorem B.4 holds for ⌊r⌋ trials as well (integrality slack)
        assert acc.delta_star(alpha) <= acc.delta_star(alpha, exact=False)


def _independent_tct_epsilon(eps0: float, hits: int, delta: float) -> float:
    """Smallest ε over every whole cap m of data-holder calls: basic m·ε₀, or the m pure calls
    composed at δ_c = δ − P[X > m] (Theorem B.4 with r = m) — advanced ½mε₀² + ε₀√(2m ln(1/δ_c)) and
    the optimal composition by a direct hockey-stick sum (tests/composition_support.py) — written
    independently of the accountant (negative binomial tails, exhaustive over m)."""
    q = 1.0 / (math.exp(eps0) + 1.0)
    ms = np.arange(hits, int(60 * hits / q) + 2)
    fail = stats.nbinom.sf(ms - hits, hits, q)
    ok = fail < delta
    ms, fail = ms[ok], fail[ok]
    basic = ms * eps0
    adv = 0.5 * ms * eps0**2 + eps0 * np.sqrt(2.0 * ms * np.log(1.0 / (delta - fail)))
    best = float(min(basic.min(), adv.min()))
    for m, f in zip(ms.tolist(), fail.tolist()):
        if direct_epsilon(eps0, m, delta) >= best:  # a lower bound that grows with m
            break
        best = min(best, direct_epsilon(eps0, m, delta - f))
    return best


@pytest.mark.parametrize("eps,delta,k,neighbours", [(1.0, 1e-6, 3, "replace"), (1.0, 1e-6, 3, "add_remove"),
                                                    (0.7, 5e-7, 20, "replace")])
def test_individual_charging_calibration_against_independent_tails(eps, delta, k, neighbours):
    """The calibrated noise delivers at most the target under the ⌊r⌋ rule computed independently
    (the 1 + ⌊r⌋ rule gave ε ≈ 1.0125 for tct heavy hitters at ε = 1, δ = 1e−6, k = 3)."""
    eps0 = cal.calibrate_individual_charging(eps, delta, k, neighbours)
    hits = cal.tct_hits_per_user(k, neighbours)
    independent = _independent_tct_epsilon(eps0, hits, delta)
    assert independent <= eps * (1 + 1e-6)
    bound = cal.individual_charging_privacy(eps0, k, delta, neighbours)
    assert bound.r == math.floor(bound.r)  # a whole cap of calls
    assert bound.delta_star == pytest.approx(_calls_beyond(bound.r, hits, cal.not_prior_q(eps0)), rel=1e-9)
    assert bound.epsilon >= independent * (1 - 1e-6)  # never claims less than the exhaustive search
    assert bound.epsilon <= independent * 1.01       # and the search over caps loses at most 1%


def test_outside_interval_calibration_against_independent_tails():
    """The band monitor (2 hits under replace): 1.0395 at ε = 1 under the 1 + ⌊r⌋ rule."""
    a = cal.calibrate_outside_interval(1.0, 1e-6, "replace")
    assert _independent_tct_epsilon(a, 2, 1e-6) <= 1.0 * (1 + 1e-6)


def test_best_is_no_worse_than_any_fixed_alpha():
    acc = cal.TargetChargingAccountant(0.05, 10)
    best = acc.best(1e-6)
    for alpha in (0.5, 1.0, 2.0, 5.0):
        b = acc.basic(alpha)
        if b.delta <= 1e-6:
            assert best.epsilon <= b.epsilon * (1 + 1e-9)
    assert best.delta <= 1e-6 * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------
# round trips: recomputing ε from the derived parameters gives the target back
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
@pytest.mark.parametrize("eps,delta,k", [(1.0, 1e-6, 3), (0.5, 1e-8, 1), (2.0, 1e-5, 10)])
def test_threshold_monitor_round_trip(eps, delta, k, neighbours):
    et, dt = cal.calibrate_threshold_monitor(eps, delta, k, neighbours)
    back = cal.threshold_monitor_privacy(et, dt, k, neighbours)
    assert back.epsilon == pytest.approx(eps, rel=1e-12)
    assert back.delta == pytest.approx(delta, rel=1e-12)
    # Theorem 3.2's formula, by hand
    xi = 75 * (k + 1) * et / math.log(1 / dt) + 25 * et
    assert back.epsilon == pytest.approx(xi if neighbours == "add_remove" else 2 * xi)


def test_threshold_monitor_noise_constants():
    big_delta, s_w, s_v = cal.threshold_monitor_noise(0.1, 1e-6)
    b = math.log(1e6) / 0.1
    assert s_v == pytest.approx(b)
    assert big_delta == pytest.approx(b * math.log(b))
    assert s_w == pytest.approx(10 * big_delta)


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
@pytest.mark.parametrize("eps,delta,tau", [(1.0, 1e-6, 3), (0.5, 1e-7, 1), (2.0, 1e-6, 20)])
def test_individual_charging_round_trip(eps, delta, tau, neighbours):
    e0 = cal.calibrate_individual_charging(eps, delta, tau, neighbours)
    back = cal.individual_charging_privacy(e0, tau, delta, neighbours)
    assert back.epsilon <= eps * (1 + 1e-12)
    assert back.epsilon == pytest.approx(eps, rel=1e-6)
    assert back.delta <= delta * (1 + 1e-12)


def test_replace_costs_more_than_add_remove_for_tct():
    a = cal.calibrate_individual_charging(1.0, 1e-6, 5, "add_remove")
    r = cal.calibrate_individual_charging(1.0, 1e-6, 5, "replace")
    assert r < a
    assert cal.tct_hits_per_user(5, "replace") == 10


@pytest.mark.parametrize("eps,delta,tops", [(1.0, 1e-6, 1), (1.0, 1e-6, 100), (0.3, 1e-9, 5000)])
def test_svt_restart_round_trip(eps, delta, tops):
    e1 = cal.calibrate_svt_restart(eps, delta, tops)
    back = cal.svt_restart_privacy(e1, tops, delta)
    assert back.epsilon == pytest.approx(eps, rel=1e-9)
    assert back.epsilon <= eps * (1 + 1e-12)
    if tops == 1:
        assert e1 == pytest.approx(eps)  # one run of AboveThreshold is ε₁-DP


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
@pytest.mark.parametrize("eps,delta,horizon", [(1.0, 1e-6, 10_000), (0.5, 1e-8, 10)])
def test_naive_round_trip(eps, delta, horizon, neighbours):
    s2 = cal.calibrate_naive(eps, delta, horizon, neighbours)
    back = cal.naive_privacy(s2, horizon, delta, neighbours)
    assert back.epsilon == pytest.approx(eps, rel=1e-9)
    factor = 1 if neighbours == "add_remove" else 2
    assert zcdp_to_approx_dp(horizon * factor / (2 * s2), delta) == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_outside_interval_round_trip(neighbours):
    a = cal.calibrate_outside_interval(1.0, 1e-6, neighbours)
    back = cal.outside_interval_privacy(a, 1e-6, neighbours)
    assert back.epsilon == pytest.approx(1.0, rel=1e-6)
    assert back.delta <= 1e-6 * (1 + 1e-12)
    # the notes' simplified constant (Theorem C.6 route) is looser at the same a
    assert cal.outside_interval_privacy_simplified(a, 1e-6, neighbours).epsilon > back.epsilon


def test_outside_interval_pure_round_trip():
    a = cal.calibrate_outside_interval_pure(2.0, 8)
    assert cal.outside_interval_pure_privacy(a, 8).epsilon == pytest.approx(2.0)


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: cal.calibrate_threshold_monitor(-1.0, 1e-6, 3), "epsilon"),
        (lambda: cal.calibrate_threshold_monitor(1.0, 2.0, 3), "delta"),
        (lambda: cal.calibrate_threshold_monitor(1.0, 1e-6, 0), "k"),
        (lambda: cal.calibrate_threshold_monitor(1.0, 1e-6, 3, "swap"), "neighbours"),
        (lambda: cal.calibrate_threshold_monitor(1600.0, 1e-6, 3, "replace"), "epsilon"),
        (lambda: cal.calibrate_individual_charging(1.0, 1e-6, 0), "tau"),
        (lambda: cal.calibrate_svt_restart(1.0, 1e-6, 0), "max_tops"),
        (lambda: cal.calibrate_naive(1.0, 1e-6, 0), "horizon"),
        (lambda: cal.TargetChargingAccountant(0.1, 5).r(-1.0), "alpha"),
        (lambda: cal.threshold_monitor_noise(100.0, 0.5), "epsilon"),
    ],
)
def test_argument_errors_name_the_argument(call, name):
    with pytest.raises((ValueError, TypeError), match=name):
        call()


# ---------------------------------------------------------------------------------------------
# exact tails of the noise laws (against brute-force sums) and the samplers
# ---------------------------------------------------------------------------------------------


def _dl_pmf(s, xs):
    r = math.exp(-1 / s)
    return (1 - r) / (1 + r) * r ** np.abs(xs)


def test_discrete_laplace_tails():
    law = DiscreteLaplaceLaw(3.3)
    xs = np.arange(-500, 501)
    p = _dl_pmf(3.3, xs)
    for y in (-5.5, -1, 0, 0.2, 1, 7, 30):
        assert math.exp(law.log_sf(y)) == pytest.approx(p[xs >= y].sum(), rel=1e-9)
        assert math.exp(law.log_cdf(y)) == pytest.approx(p[xs <= y].sum(), rel=1e-9)


def test_capped_sum_tails():
    sw, sv, cap = 7.0, 2.5, 3.4
    law = CappedSumLaw(sw, sv, cap)
    xs = np.arange(-700, 701)
    total = xs[:, None] + np.minimum(xs.astype(float), cap)[None, :]
    prob = _dl_pmf(sw, xs)[:, None] * _dl_pmf(sv, xs)[None, :]
    for y in (-20, -3.2, 0, 2, 3.4, 5, 40, 90):
        assert math.exp(law.log_sf(y)) == pytest.approx(prob[total >= y].sum(), rel=1e-8)
        assert math.exp(law.log_cdf(y)) == pytest.approx(prob[total <= y].sum(), rel=1e-8)
    # quantiles are the smallest integers meeting the tail bound
    u = upper_quantile(law, math.log(1e-6))
    assert prob[total >= u].sum() <= 1e-6 < prob[total >= u - 1].sum()
    lo = lower_quantile(law, math.log(1e-6))
    assert prob[total <= -lo].sum() <= 1e-6 < prob[total <= -(lo - 1)].sum()


def test_discrete_gaussian_tails():
    law = DiscreteGaussianLaw(4.0)
    xs = np.arange(-300, 301)
    p = np.exp(-xs.astype(float) ** 2 / 8.0)
    p /= p.sum()
    for y in (-3, 0, 1, 5, 9, 20):
        assert math.exp(law.log_sf(y)) == pytest.approx(p[xs >= y].sum(), rel=1e-9)


def test_binomial_draw_matches_the_binomial():
    src = as_random_source(11)
    draws = np.array([binomial_draw(src, 40, exact_probability(Fraction(1, 10))) for _ in range(4000)])
    observed = np.bincount(draws, minlength=41)[:12]
    expected = stats.binom.pmf(np.arange(12), 40, 0.1) * draws.size
    chi2 = (((observed - expected) ** 2) / expected)[expected > 5].sum()
    assert chi2 < stats.chi2.ppf(0.9999, (expected > 5).sum() - 1)
    # huge n, tiny p (|X| = 2^32 with p ~ 1e-9): mean 4.29
    big = np.array([binomial_draw(src, 2**32, exact_probability(1e-9)) for _ in range(2000)])
    assert abs(big.mean() - 4.294967296) < 5 * math.sqrt(4.29 / 2000)


def test_geometric_draw_mean():
    src = as_random_source(12)
    g = np.array([geometric_draw(src, exact_probability(Fraction(1, 5))) for _ in range(4000)])
    assert abs(g.mean() - 4.0) < 5 * math.sqrt(20.0 / 4000)  # mean (1−p)/p, var (1−p)/p²
    observed = np.bincount(g, minlength=12)[:12]
    expected = 0.2 * 0.8 ** np.arange(12) * g.size
    assert (((observed - expected) ** 2) / expected).sum() < stats.chi2.ppf(0.9999, 11)


@pytest.mark.parametrize("domain", [50, 2**32])
def test_choose_absent_ids_is_uniform_and_avoids_support(domain):
    src = as_random_source(13)
    support = np.array([0, 3, 4, 9, 20], dtype=np.int64)
    if domain == 50:
        counts = np.zeros(domain)
        for _ in range(3000):
            ids = choose_absent_ids(src, domain, support, 3)
            assert ids.size == 3 and np.unique(ids).size == 3
            assert not np.isin(ids, support).any()
            counts[ids] += 1
        absent = np.setdiff1d(np.arange(domain), support)
        expected = 3000 * 3 / absent.size
        chi2 = ((counts[absent] - expected) ** 2 / expected).sum()
        assert chi2 < stats.chi2.ppf(0.9999, absent.size - 1)
    else:
        ids = choose_absent_ids(src, domain, support, 1000)
        assert ids.size == 1000 and np.unique(ids).size == 1000
        assert ids.max() < domain and not np.isin(ids, support).any()
        # uniform over [0, 2^32): the mean is close to 2^31
        assert abs(ids.mean() / 2**32 - 0.5) < 5 * math.sqrt(1 / 12 / 1000)


def test_active_histogram_paths_agree():
    from pipeline.monitors.sparse import active_histogram

    rng = np.random.default_rng(14)
    vals = rng.integers(0, 5000, 3000)
    s_small, c_small = active_histogram(vals, 5000)  # bincount path (domain ≤ 4n + 2^16)
    s_big, c_big = active_histogram(vals, 2**33)  # np.unique path
    assert np.array_equal(s_small, s_big) and np.array_equal(c_small, c_big)
    assert c_small.sum() == 3000 and np.all(c_small > 0)


# ---------------------------------------------------------------------------------------------
# the zero-count shortcut is exact (pipeline/privacy/exact.py)
# ---------------------------------------------------------------------------------------------

class ScriptedSource(RandomSource):
    """Replays given 64-bit words (to place U exactly where a float inversion goes wrong)."""

    secure = False

    def __init__(self, words):
        self._words = list(words)

    def words(self, size):
        out, self._words = self._words[:size], self._words[size:]
        assert len(out) == size, "ran out of scripted words"
        return np.array(out, dtype=np.uint64)

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


TWO_THIRDS_64 = int("AA" * 8, 16)  # ⌊(2/3)·2^64⌋: U's first 64 bits straddle 2/3


@pytest.mark.parametrize("second, want", [(TWO_THIRDS_64 - 1, 0), (TWO_THIRDS_64 + 1, 1)])
def test_binomial_draw_decides_at_the_exact_boundary(second, want):
    """Bin(1, 1/3): K = 0 iff U < 2/3. With U's first word ⌊(2/3)·2^64⌋, 64 bits cannot tell; the
    draw reads a second word and decides exactly (a float inversion answers from the first word
    alone, the same for both)."""
    src = ScriptedSource([TWO_THIRDS_64, second])
    assert binomial_draw(src, 1, exact_probability(Fraction(1, 3))) == want
    assert src._words == []  # exactly one refinement


@pytest.mark.parametrize("second, want", [(TWO_THIRDS_64 - 1, 0), (TWO_THIRDS_64 + 1, 1)])
def test_geometric_draw_decides_at_the_exact_boundary(second, want):
    """P(G ≥ 1) = q = 2/3 (p = 1/3): G = 0 iff U < 1/3... with 1 − U's role: F(0) = 1 − q = 1/3 < U
    decides G ≥ 1. Place U at 1/3 ± 2^-128 through the words of ⌊(1/3)·2^64⌋."""
    third = int("55" * 8, 16)
    second = {TWO_THIRDS_64 - 1: third - 1, TWO_THIRDS_64 + 1: third + 1}[second]
    src = ScriptedSource([third, second] + [0] * 8)
    g = geometric_draw(src, exact_probability(Fraction(1, 3)))
    assert (g == 0) == (want == 0)


@pytest.mark.parametrize("law, ys", [
    (DiscreteLaplaceLaw(3.7), (-3, 0, 1, 5, 40, 400)),
    (DiscreteGaussianLaw(4.0), (-3, 0, 1, 5, 9, 20)),
    (DiscreteGaussianLaw(0.3), (0, 1, 3)),
    (DiscreteGaussianLaw(2.5e4), (30, 1500)),
    (CappedSumLaw(30.0, 12.0, 25.3), (-10, 0, 5, 26, 60, 300)),
])
def test_tail_intervals_contain_the_tail_and_narrow_with_digits(law, ys):
    """sf_interval encloses the float tail (itself checked against brute force above) at 34 digits,
    and at 68 digits gives a nested interval about 10^-30 times as wide."""
    for y in ys:
        lo34, hi34 = law.sf_interval(y, 34).lo, law.sf_interval(y, 34).hi
        fine = law.sf_interval(y, 68)
        f = math.exp(law.log_sf(y))
        assert float(lo34) <= f * (1 + 1e-9) and f * (1 - 1e-9) <= float(hi34), (y, f, lo34, hi34)
        assert lo34 <= fine.hi and fine.lo <= hi34  # both contain the true value
        assert Fraction(fine.hi - fine.lo) <= Fraction(hi34 - lo34) / 10**25 or fine.hi == fine.lo


def test_interval_arithmetic_encloses_exact_results():
    third = Interval.of(Fraction(1, 3), 20)
    assert third.lo < Fraction(1, 3) < third.hi and third.hi - third.lo <= Fraction(1, 10**19)
    x = (third * 3 - 1) / 7  # contains 0
    assert x.lo <= 0 <= x.hi
    # references to 40 digits (e and ln 2), so within 10^-40 of the truth
    tol = Fraction(1, 10**40)
    for got, ref in ((Interval.of(1, 30).exp(), Fraction("2.718281828459045235360287471352662497757")),
                     (Interval.of(2, 30).ln(), Fraction("0.6931471805599453094172321214581765680755"))):
        assert got.lo <= ref + tol and ref - tol <= got.hi and got.hi - got.lo < Fraction(1, 10**28)


def test_conditional_tail_draws_follow_the_geometric_law():
    """tct's published value of a flagged zero-count element: t + G, P(G ≥ g) = ρ^g (chi-square)."""
    law = DiscreteLaplaceLaw(2.0)
    draws = law.sample_conditional_tail(as_random_source(21), 7, 6000) - 7
    observed = np.bincount(draws, minlength=10)[:10]
    expected = (1 - law.rho) * law.rho ** np.arange(10) * draws.size
    assert draws.min() >= 0
    assert (((observed - expected) ** 2) / expected).sum() < stats.chi2.ppf(0.9999, 9)


def test_choose_absent_ids_enumerated_path_is_uniform():
    """The small-complement path (partial Fisher–Yates with exact integers): every absent id is
    chosen with probability count/|absent| (chi-square over 4000 draws)."""
    src = as_random_source(22)
    support = np.arange(0, 40, 2, dtype=np.int64)  # 20 of 40 ids held: 20 absent, count 5 → enumerated
    counts = np.zeros(40)
    for _ in range(4000):
        ids = choose_absent_ids(src, 40, support, 5)
        assert ids.size == 5 and np.unique(ids).size == 5 and not np.isin(ids, support).any()
        counts[ids] += 1
    absent = np.setdiff1d(np.arange(40), support)
    expected = 4000 * 5 / absent.size
    assert ((counts[absent] - expected) ** 2 / expected).sum() < stats.chi2.ppf(0.9999, absent.size - 1)
