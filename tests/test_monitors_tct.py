"""SVT with individual charging (Cohen–Lyu Alg. 5): charging, removal at τ, published values,
sparse vs dense, state round trip."""

import math

import numpy as np
import pytest

from pipeline.monitors import IndividualChargingSVT, individual_charging_privacy
from pipeline.privacy.rng import as_random_source
from pipeline.serialization import dumps_state, loads_state


def test_charging_and_removal_at_tau():
    n, domain = 3000, 100
    svt = IndividualChargingSVT(n, 0.5, tau=2, seed=1)
    vals = np.zeros(n, dtype=np.int64)
    vals[2000:] = 50 + np.arange(1000) % 40  # background: weight 25 each, never near the threshold
    for _ in range(2):
        flagged, published = svt.query_all_elements(vals, domain, threshold=1000)
        assert list(flagged) == [0]  # 2000 ≫ 1000
        assert abs(int(published[0]) - 2000) < 60  # noise DL(2)
    assert np.all(svt.counters[:2000] == 2) and not svt.active[:2000].any()
    assert np.all(svt.counters[2000:] == 0)
    flagged, _ = svt.query_all_elements(vals, domain, threshold=1000)
    assert 0 not in flagged  # retired users stopped counting


def test_generic_query_charges_only_contributing_present_records():
    n = 1000
    svt = IndividualChargingSVT(n, 1.0, tau=1, granularity=2, seed=2)
    contrib = np.zeros(n)
    contrib[:900] = 1.0
    contrib[900] = 0.5
    value = svt.query(contrib, threshold=100)
    assert value is not None and abs(value - 900.5) < 30
    assert np.all(svt.counters[:901] == 1) and np.all(svt.counters[901:] == 0)
    assert svt.query(contrib, threshold=100) is None  # all contributors removed (τ = 1)
    with pytest.raises(ValueError, match="contributions"):
        svt.query(-contrib, threshold=1)


def test_conditional_tail_law():
    svt = IndividualChargingSVT(1, 0.2, tau=1)
    law = svt.noise_law
    draws = law.sample_conditional_tail(as_random_source(3), 40, 20000)
    assert draws.min() >= 40
    mean_excess = law.rho / (1 - law.rho)  # Geometric on {0, 1, ...} with ratio ρ
    sd = math.sqrt(law.rho) / (1 - law.rho)
    assert abs((draws - 40).mean() - mean_excess) < 4.5 * sd / math.sqrt(draws.size)


def _dense(svt, vals, domain, t):
    flags, pubs = [], []
    for x in range(domain):
        v = svt.query((vals == x).astype(float), threshold=t)
        if v is not None:
            flags.append(x)
            pubs.append(v)
    return np.array(flags, dtype=np.int64), np.array(pubs)


def test_sparse_matches_dense_in_distribution():
    domain, n, runs, t = 8, 40, 1200, 6
    base = np.repeat(np.arange(3), [20, 12, 8])  # elements 3..7 have count 0
    eps0 = 0.4  # scale 2.5: zero-count flag probability ρ^6/(1+ρ) ≈ 0.05
    sp, de = np.zeros((2, domain)), np.zeros((2, domain))
    sp_pub, de_pub = [], []
    for r in range(runs):
        a = IndividualChargingSVT(n, eps0, tau=1, seed=5000 + r)
        b = IndividualChargingSVT(n, eps0, tau=1, seed=70000 + r)
        for s in range(2):
            fa, pa = a.query_all_elements(base, domain, t)
            fb, pb = _dense(b, base, domain, t)
            sp[s, fa] += 1
            de[s, fb] += 1
            sp_pub.extend(pa[fa >= 3])
            de_pub.extend(pb[fb >= 3])
    pool = (sp + de) / (2 * runs)
    se = np.sqrt(np.maximum(pool * (1 - pool), 1e-12) * 2 / runs)
    assert np.all(np.abs(sp - de) / runs <= 4.5 * se + 1e-12), (sp, de)
    # published values of zero-count flags: same law (mean within tolerance)
    sp_pub, de_pub = np.array(sp_pub, float), np.array(de_pub, float)
    assert sp_pub.min() >= t and de_pub.min() >= t
    sd = max(sp_pub.std(), de_pub.std(), 1.0)
    assert abs(sp_pub.mean() - de_pub.mean()) < 4.5 * sd * math.sqrt(1 / sp_pub.size + 1 / de_pub.size)


def test_state_round_trip_and_privacy():
    n, domain = 400, 2**32
    rng = np.random.default_rng(8)
    steps = [rng.integers(0, 30, n) for _ in range(5)]
    a = IndividualChargingSVT(n, 0.3, tau=3, seed=9)
    for s in steps[:2]:
        a.query_all_elements(s, domain, 68)
    blob = dumps_state(a.get_state())
    b = IndividualChargingSVT.from_state(loads_state(blob))
    for s in steps[2:]:
        fa, pa = a.query_all_elements(s, domain, 68)
        fb, pb = b.query_all_elements(s, domain, 68)
        assert np.array_equal(fa, fb) and np.array_equal(pa, pb)
    assert dumps_state(a.get_state()) == dumps_state(b.get_state())
    assert a.privacy(1e-6).epsilon == pytest.approx(individual_charging_privacy(0.3, 3, 1e-6).epsilon)
    with pytest.raises(ValueError, match="threshold"):
        a.query_all_elements(steps[0], domain, 0)
