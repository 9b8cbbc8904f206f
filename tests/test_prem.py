"""PREM (Ghazi, Guzmán, Kamath, Knop, Kumar, Manurangsi, Sachdeva, arXiv 2502.14809): FindMarginExample's
Lemma 3.2, the (ζ, α) guarantee of Theorem 3.1 (charged accounting, docs/prem.md), the paper's
constants, and the privacy calibration round trip."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import sparse

from pipeline.monitors.interval import OutsideIntervalMonitor, OutsideIntervalMonitorPure
from pipeline.privacy.rng import SeededRandom
from pipeline.synth.prem import APPROX, MINUS, PLUS, PREM, IntervalNoise, as_query_matrix, find_margin_example
from pipeline.synth.prem_privacy import (advanced_composition, calibrate_advanced_composition, charged_plan,
                                         paper_plan, plan_privacy)

ZETA = 0.1


def _interval_family(domain: int, count: int, rng: np.random.Generator, max_len: int) -> list[np.ndarray]:
    lengths = np.exp(rng.uniform(0.0, math.log(max_len), count)).astype(np.int64) + 1
    starts = rng.integers(0, domain - lengths + 1)
    return [np.arange(s, s + ln) for s, ln in zip(starts, lengths)]


def _histograms(domain: int, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    zipf = 1.0 / np.arange(1, domain + 1) ** 1.2
    heavy = np.full(domain, 0.2 / (domain - 1))
    heavy[domain // 3] = 0.8
    sparse_p = np.zeros(domain)
    sparse_p[rng.choice(domain, domain // 50, replace=False)] = 1.0
    out = {}
    for name, p in {"uniform": np.ones(domain), "zipf": zipf[rng.permutation(domain)], "one_heavy": heavy,
                    "sparse": sparse_p}.items():
        out[name] = rng.multinomial(n, p / p.sum()).astype(np.int64)
    return out


# ---------------------------------------------------------------------------------------------
# Lemma 3.2: FindMarginExample
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("monitor", ["approx", "pure"])
@pytest.mark.parametrize("scale, expect", [(1.0, APPROX), (0.5, PLUS), (1.6, MINUS)])
def test_find_margin_example_lemma_3_2(scale, expect, monitor):
    """Lemma 3.2 (Ghazi et al.) on a fixed h with ĥ = scale·h (+ uniform): the three parts partition Y;
    the returned part holds ≥ 1/3 of ĥ's mass on Y; on the good event (all answers within C, prob.
    ≥ 1 − β by Proposition 2.2) Approx ⇒ (ζ, α₀)-accuracy on S for every f, +1 ⇒ h(S) ≥ (1+ζ)ĥ(S),
    −1 ⇒ h(S) ≤ (1−ζ/2)ĥ(S). With ĥ = h the answer is Approx, with ĥ = h/2 it is +1, with 1.6h −1."""
    rng = np.random.default_rng(7)
    domain, beta = 512, 0.01
    h = rng.multinomial(100_000, rng.dirichlet(np.ones(domain) * 0.3)).astype(np.int64)
    q = as_query_matrix(_interval_family(domain, 300, rng, 64) + [np.arange(domain)], domain)
    a = 0.5
    m = q.shape[0]
    if monitor == "approx":
        margin = OutsideIntervalMonitor(np.zeros(1, np.int64), a, seed=0).utility_margin(m * m, beta)
    else:  # Proposition C.3's margin; Γ = m Above/Below answers at most per call
        margin = OutsideIntervalMonitorPure(np.zeros(1, np.int64), a, m, seed=0).utility_margin(m * m, beta)
    alpha0 = 2.0 * (1.0 + ZETA) * margin
    active = np.ones(domain, dtype=bool)
    active[:20] = False                       # Y ≠ X: elements outside Y must never be returned
    est = scale * h + 1.0
    seen = set()
    for seed in range(12):
        ex = find_margin_example(q, h, est, active, ZETA, alpha0, IntervalNoise(monitor, a, SeededRandom(seed)))
        seen.add(ex.theta)
        parts = ex.plus.astype(int) + ex.minus.astype(int) + ex.active.astype(int)
        assert np.array_equal(parts, active.astype(int)), "S+, S-, S_active must partition Y"
        assert ex.certified
        assert est[ex.support].sum() >= est[active].sum() / 3.0 - 1e-9
        s = ex.support
        if ex.theta == APPROX:
            fh, fe = q @ (h * s), q @ (est * s)
            assert np.all(fe >= (1 - ZETA) * fh - alpha0) and np.all(fe <= (1 + ZETA) * fh + alpha0)
        elif ex.theta == PLUS:
            assert h[s].sum() >= (1 + ZETA) * est[s].sum()
        else:
            assert h[s].sum() <= (1 - ZETA / 2) * est[s].sum()
    assert seen == {expect}


def _reference_fme(rows, h, est, active, zeta, alpha0, noise):
    """Algorithm 2 written out query by query with masks (O(|X|) per query): the incremental sums of
    :func:`find_margin_example` must give the same answers for the same noise draws. One call is one
    monitor: it starts by drawing the pure rule's η."""
    noise.start_call()
    active = active.copy()
    plus, minus = np.zeros_like(active), np.zeros_like(active)
    f_active = list(range(len(rows)))
    while True:
        draws = noise.draw(len(f_active))
        accurate, keep = True, []
        for k, j in enumerate(f_active):
            mask = np.zeros_like(active)
            mask[rows[j]] = True
            sel = mask & active
            hi = (est[sel].sum() + alpha0 / 2) / (1 - zeta)
            lo = (est[sel].sum() - alpha0 / 2) / (1 + zeta)
            ans = noise.answers(np.array([float(h[sel].sum())]), draws[..., k:k + 1], np.array([lo]), np.array([hi]))[0]
            if ans == APPROX:
                keep.append(j)
                continue
            (plus if ans == PLUS else minus)[sel] = True
            active &= ~mask
            noise.after_outside()
            accurate = False
        f_active = keep
        if accurate:
            return plus, minus, active


@pytest.mark.parametrize("monitor", ["approx", "pure"])
def test_find_margin_example_matches_reference(monitor):
    rng = np.random.default_rng(21)
    domain = 300
    h = rng.multinomial(30_000, rng.dirichlet(np.ones(domain) * 0.5)).astype(np.int64)
    rows = _interval_family(domain, 80, rng, 40)
    q = as_query_matrix(rows, domain)
    for seed in range(4):
        est = h * rng.uniform(0.6, 1.5, domain) + rng.uniform(0, 3, domain)
        active = rng.random(domain) < 0.9
        ex = find_margin_example(q, h, est, active, ZETA, 40.0, IntervalNoise(monitor, 0.8, SeededRandom(seed)))
        plus, minus, act = _reference_fme(rows, h, est, active, ZETA, 40.0, IntervalNoise(monitor, 0.8, SeededRandom(seed)))
        assert np.array_equal(ex.plus, plus) and np.array_equal(ex.minus, minus) and np.array_equal(ex.active, act)
        assert ex.passes > 1 and (plus.any() or minus.any())


def test_find_margin_example_rechecks_after_removals():
    """Algorithm 2 repeats passes until one is all Inside: a query answered Inside early in a pass
    can leave its band once other answers shrink S_active. ĥ = 0.7h on the left half, 1.3h on the
    right: the spanning query is Inside at first (errors cancel), the left query is Above and
    removes the left half, and only the second pass sees the spanning query's right part Below.
    Certifying after the first pass would return the right half as Approx, off by 30%."""
    domain = 200
    h = np.full(domain, 500, dtype=np.int64)
    est = np.where(np.arange(domain) < domain // 2, 0.7, 1.3) * h
    q = as_query_matrix([np.arange(domain), np.arange(domain // 2)], domain)
    for seed in range(5):
        ex = find_margin_example(q, h, est, np.ones(domain, bool), ZETA, 20.0,
                                 IntervalNoise("approx", 1.0, SeededRandom(seed)))
        assert ex.theta == MINUS and ex.passes == 3  # the third pass has no queries left: accurate
        assert ex.plus[: domain // 2].all() and ex.minus[domain // 2:].all() and not ex.active.any()


def test_mwu_moves_mass_towards_the_data():
    """From the paper's uniform start, the mass of one heavy element (80% of n) must be moved by the
    MWU steps until a round is certified within the call cap; an update in the wrong direction
    never gets there (the cap is hit and ``exhausted`` set)."""
    rng = np.random.default_rng(4)
    domain, n = 512, 100_000
    p = np.full(domain, 0.2 / (domain - 1))
    p[77] = 0.8
    h = rng.multinomial(n, p).astype(np.int64)
    fam = _interval_family(domain, 100, rng, 64)
    prem = PREM(domain, fam, ZETA, 1.0, 1e-6, seed=9, accounting="charged", init_share=0.0, eta=0.5,
                max_calls=40, max_rounds=3)
    out = prem.fit(h)
    assert prem.calls > 3 and not prem.exhausted and prem.alpha <= prem.plan.alpha
    truth, got = prem.queries @ h, prem.queries @ out
    assert np.all(got >= (1 - ZETA) * truth - prem.alpha) and np.all(got <= (1 + ZETA) * truth + prem.alpha)


def test_interval_noise_matches_monitor_rule_and_scale():
    """The vectorised answers follow Algorithm 1's rule (Inside iff lo < v̂ < hi, Above iff v̂ ≥ hi),
    and the draws have the variance of DLap(a): 2ρ/(1−ρ)², ρ = e^{−a} (5-sigma CLT tolerance; a
    scale off by √2 moves the variance by 100%)."""
    a = 0.2
    noise = IntervalNoise("approx", a, SeededRandom(3))
    draws = noise.draw(40_000).astype(np.float64)
    rho = math.exp(-a)
    var = 2 * rho / (1 - rho) ** 2
    # Var of the sample variance ≈ (μ₄ − σ⁴)/N; for the two-sided geometric μ₄ ≈ 6σ⁴ when a is small.
    assert abs(draws.var() - var) < 5 * math.sqrt(5.0 * var**2 / draws.size)
    values = np.array([0.0, 10.0, 20.0])
    ans = noise.answers(values, np.array([0, 0, 0]), np.full(3, 5.0), np.full(3, 15.0))
    assert list(ans) == [MINUS, APPROX, PLUS]
    edge = noise.answers(np.array([5.0, 15.0]), np.array([0, 0]), np.full(2, 5.0), np.full(2, 15.0))
    assert list(edge) == [MINUS, PLUS]  # the band is open: lo < v̂ < hi


# ---------------------------------------------------------------------------------------------
# Privacy calibration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("monitor", ["approx", "pure"])
def test_paper_plan_round_trip_and_scale(monitor):
    """Recomputing (ε, δ) from the paper plan's noise parameters gives the target back; the constants
    are the printed ones (notes: I = 76, T ≈ 1.77e5 at n = |X| = 1e6, ζ = 0.1), and α exceeds n."""
    eps, delta = 1.0, (1e-6 if monitor == "approx" else 0.0)
    plan = paper_plan(10**6, 10**6, 10**4, ZETA, eps, delta, 0.05, monitor=monitor)
    assert plan.rounds == 76 and plan.steps == math.ceil(128 * math.log(10**6) / ZETA**2)
    assert plan.eta == ZETA / 4
    got = plan_privacy(plan)
    assert got.epsilon == pytest.approx(eps, rel=1e-6)
    assert got.delta <= delta * (1 + 1e-9)
    assert plan.alpha > 10**6 and plan.printed_alpha > 10**6
    if monitor == "approx":   # the calibrated a_n is at least the printed ε/(4√(2I ln(I/δ)))
        assert plan.mass_param >= plan.extra["paper_a_n"]


@pytest.mark.parametrize("monitor", ["approx", "pure"])
def test_charged_plan_round_trip(monitor):
    plan = charged_plan(4096, 500, ZETA, 0.8, 1e-6, 0.05, monitor=monitor, max_calls=10)
    got = plan_privacy(plan)
    assert got.epsilon == pytest.approx(0.8, rel=1e-6)
    assert got.delta <= 1e-6 * (1 + 1e-9)
    # a scale error would show: halving the mass noise variance must overshoot the budget
    from dataclasses import replace
    assert plan_privacy(replace(plan, mass_param=plan.mass_param / 2)).epsilon > 0.8 * (1 + 1e-3)


def test_advanced_composition_inverse():
    e0 = calibrate_advanced_composition(0.5, 1000, 1e-7)
    assert advanced_composition(e0, 1000, 1e-7) == pytest.approx(0.5, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# PREM end to end
# ---------------------------------------------------------------------------------------------


def test_paper_accounting_returns_zero_histogram_and_holds():
    """As printed, α > n at any practical size: the first ñ is below α/4 and the output is 0 — which
    is (ζ, α)-accurate only because α ≥ n."""
    rng = np.random.default_rng(1)
    h = rng.multinomial(50_000, np.ones(256) / 256).astype(np.int64)
    prem = PREM(256, _interval_family(256, 50, rng, 32), ZETA, 1.0, 1e-6, seed=1, accounting="paper")
    out = prem.fit(h)
    assert prem.alpha >= h.sum()
    assert np.all(out == 0) and prem.calls == 0


def test_charged_is_seeded_and_validates():
    rng = np.random.default_rng(2)
    h = rng.multinomial(100_000, rng.dirichlet(np.ones(1024))).astype(np.int64)
    fam = _interval_family(1024, 200, rng, 64)
    a = PREM(1024, fam, ZETA, 1.0, 1e-6, seed=5, accounting="charged").fit(h)
    b = PREM(1024, sparse.csr_matrix(as_query_matrix(fam, 1024)), ZETA, 1.0, 1e-6, seed=5,
             accounting="charged").fit(h)
    assert np.array_equal(a, b) and np.all(a >= 0)
    pure = PREM(1024, fam, ZETA, 1.0, 1e-6, seed=5, accounting="charged", monitor="pure")
    out = pure.fit(h)   # Algorithm 4's monitor: α₀ > n here, so the first ñ stops the run at once
    assert np.all(out >= 0) and pure.calls == 0 and pure.plan.alpha0 > h.sum()
    assert pure.alpha == pure.masses[-1] + pure.plan.mass_margin   # the kept remainder's bound
    refit = PREM(1024, fam, ZETA, 1.0, 1e-6, seed=5, accounting="charged")
    refit.fit(h)
    with pytest.raises(RuntimeError, match="already"):
        refit.fit(h)
    assert refit.privacy().epsilon == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ValueError, match="monitor"):
        PREM(1024, fam, ZETA, 1.0, 1e-6, monitor="exact")
    with pytest.raises(ValueError, match="accounting"):
        PREM(1024, fam, ZETA, 1.0, 1e-6, accounting="cheap")
    with pytest.raises(ValueError, match="zeta"):
        PREM(1024, fam, 0.7, 1.0, 1e-6, accounting="charged")
    with pytest.raises(ValueError, match=r"queries\[0\]"):
        PREM(16, [np.array([3, 99])], ZETA, 1.0, 1e-6)
    with pytest.raises(TypeError, match="histogram"):
        PREM(1024, fam, ZETA, 1.0, 1e-6, accounting="charged").fit(h.astype(float))
    with pytest.raises(TypeError, match="max_calls"):
        PREM(1024, fam, ZETA, 1.0, 1e-6, accounting="paper", max_calls=3)


@pytest.mark.slow
def test_charged_guarantee_over_seeded_runs():
    """Theorem 3.1's (ζ, α) guarantee for the charged accounting (docs/prem.md §3: on the event that
    every monitor answer is within C and every ñ within B, prob ≥ 1 − β, every f satisfies
    (1−ζ)f(h) − α ≤ f(ĥ) ≤ (1+ζ)f(h) + α, α the realised bound). Over 4 histograms × 4 seeds × 2
    starts it must hold in ≥ 1 − β of runs. The default (noisy start) is usually certified by the
    first call; the uniform start (the paper's) exercises the MWU loop and partial certification,
    so a wrong band, update or certification breaks the bound."""
    rng = np.random.default_rng(11)
    domain, n, beta = 2048, 200_000, 0.05
    q = as_query_matrix(_interval_family(domain, 400, rng, 256), domain)
    configs = {"noisy start": {}, "uniform start": {"init_share": 0.0, "max_calls": 60, "max_rounds": 4, "eta": 0.5}}
    runs = fails = mwu_calls = 0
    for name, h in _histograms(domain, n, rng).items():
        truth = q @ h
        for config, options in configs.items():
            for seed in range(4):
                prem = PREM(domain, q, ZETA, 1.0, 1e-6, beta=beta, seed=100 + seed, accounting="charged", **options)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # cap reached: alpha is raised, still valid
                    out = prem.fit(h)
                got = q @ out
                ok = np.all(got >= (1 - ZETA) * truth - prem.alpha) and np.all(got <= (1 + ZETA) * truth + prem.alpha)
                if config == "noisy start":
                    assert prem.alpha < n / 4, f"{name}: alpha {prem.alpha} is useless at n = {n}"
                else:
                    mwu_calls += prem.calls - prem.rounds_used
                assert np.all(out >= 0)
                runs += 1
                fails += not ok
    assert mwu_calls > 50, "the uniform start must exercise the multiplicative-weights loop"
    assert fails <= math.floor(beta * runs)


def test_a_precomputed_plan_gives_the_same_release_and_a_mismatch_is_refused():
    """``plan=`` skips the calibration only: the same seed gives the same ĥ as PREM calibrating itself;
    a plan made for another ε (or |F|, or accounting) is refused, naming the field."""
    rng = np.random.default_rng(4)
    h = rng.multinomial(5_000, rng.dirichlet(np.ones(8)))
    queries = [np.array([0, 1]), np.array([2, 3, 4]), np.array([7])]
    plan = charged_plan(8, 3, ZETA, 1.0, 1e-6, 0.05)
    own = PREM(8, queries, ZETA, 1.0, 1e-6, seed=9, accounting="charged").fit(h)
    given = PREM(8, queries, ZETA, 1.0, 1e-6, seed=9, accounting="charged", plan=plan).fit(h)
    np.testing.assert_array_equal(own, given)
    with pytest.raises(ValueError, match="epsilon=1.0 \\(here 0.5\\)"):
        PREM(8, queries, ZETA, 0.5, 1e-6, seed=9, accounting="charged", plan=plan)
    with pytest.raises(ValueError, match="n_queries"):
        PREM(8, queries[:2], ZETA, 1.0, 1e-6, seed=9, accounting="charged", plan=plan)
    with pytest.raises(ValueError, match="accounting"):
        PREM(8, queries, ZETA, 1.0, 1e-6, seed=9, accounting="paper", n=5_000, plan=plan)
    with pytest.raises(TypeError, match="not both"):
        PREM(8, queries, ZETA, 1.0, 1e-6, accounting="charged", plan=plan, max_calls=5)


def test_pure_monitor_draws_its_threshold_noise_once_per_call_within_the_margin_budget():
    """monitor="pure": every FindMarginExample call is its own run of Algorithm 4 (fresh η at the
    start, redrawn after each Above/Below), so a run of PREM draws η at most K·(Γ+1) times, and the
    margin's c_η is set for that many draws: by the union bound P(some |η| > c_η) ≤ E[draws]·p with
    p = P(|η| > c_η) = 2ρ^{c+1}/(1+ρ) (exact two-sided geometric tail, ρ = e^{−a/2}), which must stay
    within the β/4 the plan gives η (docs/prem.md §3). With one η kept across calls (the old rule)
    c_η was set for Γ + 1 draws while a run made ~4× as many here: E[draws]·p ≈ 0.05 > β/4.
    Then over seeded runs the rate of runs with some |η| > c_η, and of runs breaking the (ζ, α)
    guarantee, stays within budget (exact Binomial tolerance, Clopper–Pearson style: the count may
    exceed its budgeted mean only by the 0.999 quantile)."""
    from scipy import stats

    rng = np.random.default_rng(0)
    domain, n, beta, runs = 1024, 10**7, 0.05, 24
    q = as_query_matrix(_interval_family(domain, 30, rng, 256), domain)
    h = rng.multinomial(n, rng.dirichlet(np.full(domain, 0.3))).astype(np.int64)
    truth = q @ h
    options = {"init_share": 0.0, "max_calls": 20, "max_rounds": 1, "eta": 0.02}  # many uncertified calls
    draws, eta_fails, fails = [], 0, 0
    for seed in range(runs):
        prem = PREM(domain, q, ZETA, 1.0, 1e-6, beta=beta, seed=seed, accounting="charged", monitor="pure", **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = prem.fit(h)
        noise, plan = prem.monitor_noise, prem.plan
        assert noise.calls == prem.calls <= plan.max_calls
        assert noise.eta_draws <= noise.calls * (plan.gamma + 1)
        draws.append(noise.eta_draws)
        eta_fails += noise.eta_max_abs > plan.extra["eta_margin"]
        got = q @ out
        fails += not (np.all(got >= (1 - ZETA) * truth - prem.alpha) and np.all(got <= (1 + ZETA) * truth + prem.alpha))
    assert np.mean(draws) > 3 * (plan.gamma + 1), "the runs must make many calls with Above/Below answers"
    rho = math.exp(-plan.a / 2.0)
    p = 2.0 * rho ** (plan.extra["eta_margin"] + 1) / (1.0 + rho)
    assert np.mean(draws) * p <= beta / 4
    assert eta_fails <= stats.binom.ppf(0.999, runs, beta / 4)
    assert fails <= stats.binom.ppf(0.999, runs, beta)


def test_the_default_accounting_is_the_charged_one():
    """PREM(domain_size, queries, zeta, epsilon, delta, beta, seed).fit(h) must not return the zero
    histogram of the printed constants (α > n): the default is the charged accounting, whose (ε, δ)
    round-trips; the paper's stays selectable."""
    rng = np.random.default_rng(6)
    domain = 1024
    h = rng.multinomial(10**6, rng.dirichlet(np.ones(domain))).astype(np.int64)
    fam = _interval_family(domain, 100, rng, 128)
    prem = PREM(domain, fam, ZETA, 1.0, 1e-6, 0.05, 3)
    out = prem.fit(h)
    assert prem.plan.accounting == "charged" and prem.alpha < h.sum() / 10
    assert out.sum() > 0.9 * h.sum()
    assert prem.privacy().epsilon == pytest.approx(1.0, rel=1e-6)
    assert PREM(domain, fam, ZETA, 1.0, 1e-6, 0.05, 3, accounting="paper", n=10**6).plan.alpha > h.sum()
