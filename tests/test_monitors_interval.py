"""OutsideIntervalMonitor (approx and pure) and BandMonitor: Proposition 2.2 / C.3 utility,
active-set updates, halting, calibration, state, errors."""

import math

import numpy as np
import pytest
from scipy import stats

from pipeline.monitors import (
    ABOVE,
    BELOW,
    BETWEEN,
    BandMonitor,
    OutsideIntervalMonitor,
    OutsideIntervalMonitorPure,
    outside_interval_privacy,
)
from pipeline.serialization import dumps_state, loads_state


def _violates(answer, value, lo, hi, c):
    if answer == BETWEEN:
        return not (lo - c <= value <= hi + c)
    if answer == ABOVE:
        return not (value >= hi - c)
    return not (value <= lo + c)


@pytest.mark.parametrize("kind", ["approx", "pure"])
def test_proposition_utility_bounds(kind):
    runs, rounds, beta, domain = 150, 25, 0.1, 60
    rng = np.random.default_rng(1)
    failures = 0
    margin = None
    for r in range(runs):
        hist = rng.integers(0, 50, domain)
        if kind == "approx":
            mon = OutsideIntervalMonitor(hist, 0.2, seed=500 + r)
        else:
            mon = OutsideIntervalMonitorPure(hist, 0.5, max_outside=rounds, seed=500 + r)
        margin = mon.utility_margin(rounds, beta)
        bad = False
        for _ in range(rounds):
            f = rng.random(domain) < 0.3
            value = mon.true_value(f)
            centre = value + rng.integers(-2 * margin, 2 * margin + 1)
            lo, hi = centre - 5, centre + 5
            answer = mon.query(f, lo, hi)
            bad |= _violates(answer, value, lo, hi, margin)
        failures += bad
    assert failures <= stats.binom.ppf(1 - 1e-4, runs, beta)
    # the margin is not vacuous: it is the noise scale times a log factor, not a huge number
    scale = 1 / 0.2 if kind == "approx" else 6 / 0.5
    assert margin < 3 * scale * math.log(rounds / beta) + 10


def test_approx_margin_is_the_exact_discrete_tail():
    mon = OutsideIntervalMonitor(np.array([1, 2, 3]), 0.3)
    c = mon.utility_margin(20, 0.05)
    law = mon.noise_law
    tail = lambda c_: 2 * law.rho ** (c_ + 1) / (1 + law.rho)  # P(|N| > c)
    assert tail(c) <= 0.05 / 20 < tail(c - 1)
    # the paper's continuous-Laplace C = (1/a) ln(R/β) is within one unit of it
    assert abs(c - math.log(20 / 0.05) / 0.3) <= 1 / 0.3 + 1


def test_active_set_updates_only_on_above_or_below():
    hist = np.array([100, 100, 0, 5])
    mon = OutsideIntervalMonitor(hist, 1.0, seed=2)
    assert mon.query([0], 50, 150) == BETWEEN  # 100 inside, noise DL(1)
    assert mon.active_mask.all()
    assert mon.query([0, 1], 0, 100) == ABOVE  # 200 ≥ 100
    assert list(mon.active_mask) == [False, False, True, True]
    assert mon.true_value([0, 1, 3]) == 5
    assert mon.query(np.array([False, False, True, True]), 50, 60) == BELOW
    assert not mon.active_mask.any()
    with pytest.raises(ValueError, match="lo"):
        mon.query([0], 5, 5)
    with pytest.raises(ValueError, match="a"):
        OutsideIntervalMonitor(hist, 1.5)


def test_pure_halts_after_gamma_and_redraws_threshold_noise():
    hist = np.full(10, 100)
    mon = OutsideIntervalMonitorPure(hist, 1.0, max_outside=2, seed=3)
    assert mon.query([0], 0, 10) == ABOVE
    assert mon.query([1], 500, 600) == BELOW
    with pytest.raises(RuntimeError):
        mon.query([2], 0, 1000)
    assert mon.privacy.epsilon == pytest.approx(2.0)


def test_band_monitor_users_leave_after_contributing_to_an_alert():
    n = 2000
    band = BandMonitor.from_target(n, 1.0, 1e-6, seed=4)
    assert band.privacy(1e-6).epsilon == pytest.approx(1.0, rel=1e-6)
    vals = np.zeros(n, dtype=np.int64)
    vals[:1500] = 7
    assert band.update(vals, 7, 300, 600) == ABOVE  # 1500 ≫ 600 (noise scale ~25)
    assert not band.active[:1500].any() and band.active[1500:].all()
    # the 1500 users no longer count: value 7 now has 0 active users
    assert band.update(vals, 7, 300, 600) == BELOW
    assert band.update(vals, 0, 100, 900) == BETWEEN  # 500 users with value 0
    assert band.active[1500:].all()


def test_state_round_trip_and_privacy_matches_calibration():
    hist = np.arange(40)
    a = OutsideIntervalMonitor.from_target(hist, 1.0, 1e-6, seed=5)
    assert a.privacy(1e-6).epsilon == pytest.approx(outside_interval_privacy(a.a, 1e-6).epsilon)
    rng = np.random.default_rng(6)
    qs = [(rng.random(40) < 0.4, 100.0, 300.0) for _ in range(8)]
    for q in qs[:4]:
        a.query(*q)
    blob = dumps_state(a.get_state())
    b = OutsideIntervalMonitor.from_state(loads_state(blob))
    assert [a.query(*q) for q in qs[4:]] == [b.query(*q) for q in qs[4:]]
    assert dumps_state(a.get_state()) == dumps_state(b.get_state())
