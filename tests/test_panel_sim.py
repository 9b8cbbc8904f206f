"""The panel simulators hit their documented calibration targets and plant what they report."""

import numpy as np
import pytest

from pipeline.sim import simulate_categorical_panel, simulate_poverty_panel


@pytest.fixture(scope="module")
def poverty():
    return simulate_poverty_panel(seed=2021)


def test_poverty_shape_dtype_and_reproducibility(poverty):
    assert poverty.shape == (23374, 12)
    assert poverty.dtype == np.uint8
    assert set(np.unique(poverty)) <= {0, 1}
    np.testing.assert_array_equal(poverty, simulate_poverty_panel(seed=2021))
    assert not np.array_equal(poverty, simulate_poverty_panel(seed=2022))


def test_poverty_calibration_targets(poverty):
    monthly = poverty.mean(axis=0)
    assert 0.11 <= monthly.mean() <= 0.13
    assert np.all((monthly > 0.10) & (monthly < 0.14))
    prev = poverty[:, :-1] == 1
    persistence = poverty[:, 1:][prev].mean()
    assert 0.8 <= persistence <= 0.9


def test_poverty_heterogeneity_beyond_a_homogeneous_chain(poverty):
    months = poverty.sum(axis=1)
    all_year = (months == 12).mean()
    # A homogeneous chain with rate r and persistence p stays poor all year with probability
    # r·p^11 (≈ 0.018 here); latent chronic poverty must push this well above that.
    r = poverty.mean()
    p = poverty[:, 1:][poverty[:, :-1] == 1].mean()
    assert all_year > 1.5 * r * p**11
    assert 0.02 <= all_year <= 0.08
    assert 0.20 <= (months >= 1).mean() <= 0.35


def test_poverty_types_and_seasonality():
    panel, types = simulate_poverty_panel(n=200_000, horizon=12, seed=1, return_types=True)
    rates = [panel[types == j].mean() for j in range(3)]
    assert rates[0] > 0.8 and 0.15 < rates[1] < 0.3 and rates[2] < 0.02
    # Entry peaks in month 1 and is lowest in month 7: with a large n the drift is visible.
    flat = simulate_poverty_panel(n=200_000, horizon=12, seed=1, seasonal_amplitude=0.0)
    monthly = panel.mean(axis=0)
    assert monthly[6:9].mean() < monthly[:2].mean() - 0.003
    assert abs(flat.mean(axis=0)[6:9].mean() - flat.mean(axis=0)[:2].mean()) < 0.003


def test_poverty_argument_errors():
    with pytest.raises(ValueError, match="n must"):
        simulate_poverty_panel(n=0)
    with pytest.raises(TypeError, match="horizon"):
        simulate_poverty_panel(n=10, horizon=1.5)
    with pytest.raises(ValueError, match="seasonal_amplitude"):
        simulate_poverty_panel(n=10, seasonal_amplitude=1.0)
    with pytest.raises(TypeError, match="seed"):
        simulate_poverty_panel(n=10, seed="x")


def test_categorical_persistence_and_weights():
    panel = simulate_categorical_panel(50_000, 6, 3, seed=4, persistence=0.9, weights=[0.6, 0.04, 0.36])
    assert panel.shape == (50_000, 6) and panel.min() >= 0 and panel.max() <= 2
    np.testing.assert_allclose(np.bincount(panel[:, -1], minlength=3) / 50_000, [0.6, 0.04, 0.36], atol=0.01)
    # P(same value next step) = persistence + (1 - persistence)·Σ w²
    same = (panel[:, 1:] == panel[:, :-1]).mean()
    assert same == pytest.approx(0.9 + 0.1 * (0.36 + 0.0016 + 0.1296), abs=0.005)


def test_categorical_planted_heavy_hitters_are_the_heavy_elements():
    n, horizon, domain = 20_000, 9, 2**16
    panel, schedule = simulate_categorical_panel(
        n, horizon, domain, seed=9, heavy_per_phase=2, heavy_share=0.03, phase_length=3
    )
    assert len(schedule) == 6
    assert [(h.start, h.stop) for h in schedule] == [(1, 3)] * 2 + [(4, 6)] * 2 + [(7, 9)] * 2
    holders = int(round(0.03 * n))
    for t in range(1, horizon + 1):
        counts = np.bincount(panel[:, t - 1], minlength=domain)
        planted = {h.element for h in schedule if h.start <= t <= h.stop}
        heavy = set(np.flatnonzero(counts >= holders // 2).tolist())
        assert heavy == planted
        for e in planted:
            assert holders <= counts[e] <= holders + 10
    assert all(h.holders == holders for h in schedule)


def test_categorical_argument_errors():
    with pytest.raises(ValueError, match="categories"):
        simulate_categorical_panel(10, 3, 0)
    with pytest.raises(ValueError, match="persistence"):
        simulate_categorical_panel(10, 3, 4, persistence=1.5)
    with pytest.raises(ValueError, match="weights"):
        simulate_categorical_panel(10, 3, 4, weights=[1, 2])
    with pytest.raises(ValueError, match="heavy_per_phase"):
        simulate_categorical_panel(10, 3, 4, heavy_per_phase=5)
    with pytest.raises(ValueError, match="heavy_share"):
        simulate_categorical_panel(10, 3, 4, heavy_per_phase=2, heavy_share=0.9)
