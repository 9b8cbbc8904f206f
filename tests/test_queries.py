"""Queries on panels: brute-force cross-checks and exact debiasing of the fixed-window padding."""

import itertools

import numpy as np
import pytest

from pipeline import queries as Q


def brute_histogram(panel, t, k, categories):
    counts = {}
    for row in panel:
        key = tuple(int(v) for v in row[t - k : t])
        counts[key] = counts.get(key, 0) + 1
    out = np.zeros(categories**k, dtype=np.int64)
    for code, pattern in enumerate(itertools.product(range(categories), repeat=k)):
        out[code] = counts.get(pattern, 0)
    return out


@pytest.mark.parametrize("categories,k", [(2, 1), (2, 3), (3, 2), (4, 3)])
def test_window_histogram_matches_brute_force(categories, k):
    rng = np.random.default_rng(categories * 10 + k)
    panel = rng.integers(0, categories, size=(57, 7))
    hists = Q.window_histograms(panel, k, categories)
    assert hists.shape == (7 - k + 1, categories**k)
    for t in range(k, 8):
        np.testing.assert_array_equal(hists[t - k], brute_histogram(panel, t, k, categories))
        assert hists[t - k].sum() == 57


def test_pattern_code_convention_oldest_value_most_significant():
    panel = np.array([[0, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(Q.window_codes(panel, 3, 3), [0b011, 0b100])
    np.testing.assert_array_equal(Q.pattern_digits(3)[0b011], [0, 1, 1])


def brute_quarterly(panel, k=3):
    out = {name: [] for name, _ in Q.QUARTERLY_QUANTITIES}
    for end in range(k, panel.shape[1] + 1, k):
        c = dict.fromkeys(out, 0)
        for row in panel:
            w = [int(v) for v in row[end - k : end]]
            c["at_least_1"] += sum(w) >= 1
            c["at_least_2"] += sum(w) >= 2
            c["at_least_2_consecutive"] += any(w[j] and w[j + 1] for j in range(k - 1))
            c["all"] += sum(w) == k
        for name in out:
            out[name].append(c[name])
    return out


@pytest.mark.parametrize("k,horizon", [(3, 12), (3, 10), (4, 8), (2, 5)])
def test_quarterly_matches_brute_force(k, horizon):
    rng = np.random.default_rng(k * 100 + horizon)
    panel = (rng.random((83, horizon)) < 0.4).astype(np.uint8)
    res = Q.quarterly_poverty(panel, k=k)
    expected = brute_quarterly(panel, k)
    np.testing.assert_array_equal(res["quarter_end"], np.arange(k, horizon + 1, k))
    for name in expected:
        np.testing.assert_array_equal(res["counts"][name], expected[name])
        np.testing.assert_allclose(res["proportions"][name], np.array(expected[name]) / 83)


def test_quarterly_mask_sizes_for_a_quarter():
    sizes = {name: int(m.sum()) for name, m in Q.quarterly_masks(3).items()}
    assert sizes == {"at_least_1": 7, "at_least_2": 4, "at_least_2_consecutive": 3, "all": 1}


def test_cumulative_matches_brute_force():
    rng = np.random.default_rng(7)
    panel = (rng.random((64, 9)) < 0.3).astype(np.uint8)
    S = Q.cumulative_counts(panel)
    assert S.shape == (9, 10)
    for t in range(1, 10):
        for b in range(0, 10):
            assert S[t - 1, b] == sum(int(row[:t].sum()) >= b for row in panel)
    counts, props = Q.cumulative_at_least(panel, 3, n=50)
    np.testing.assert_array_equal(counts, S[:, 3])
    np.testing.assert_allclose(props, S[:, 3] / 50)


def periodic_padding(n_pad, k, horizon, categories):
    """n_pad records per length-k pattern s, each repeating s with period k.

    Rotating a window (a, z) -> (z, a) is a bijection on patterns, so at every step t ≥ k the
    padding's windows are every pattern exactly n_pad times: the padding the synthesizer's
    debiasing assumes, built explicitly."""
    digits = Q.pattern_digits(k, categories)
    cols = np.arange(horizon) % k
    return np.repeat(digits[:, cols], n_pad, axis=0)


@pytest.mark.parametrize("categories,k", [(2, 3), (3, 2)])
def test_padding_construction_has_every_pattern_n_pad_times(categories, k):
    pad = periodic_padding(5, k, 9, categories)
    hists = Q.window_histograms(pad, k, categories)
    assert np.all(hists == 5)


def test_debiasing_is_exact_on_true_data_plus_padding():
    rng = np.random.default_rng(11)
    n, horizon, k, n_pad = 200, 12, 3, 17
    truth = (rng.random((n, horizon)) < 0.25).astype(np.uint8)
    synthetic = rng.permutation(np.vstack([truth, periodic_padding(n_pad, k, horizon, 2)]))
    m = synthetic.shape[0]
    assert m == n + 8 * n_pad

    true_q = Q.quarterly_poverty(truth)
    deb = Q.quarterly_poverty(synthetic, n_pad=n_pad, n=n)
    raw = Q.quarterly_poverty(synthetic)
    for name, mask in Q.quarterly_masks(3).items():
        np.testing.assert_array_equal(deb["counts"][name], true_q["counts"][name])
        np.testing.assert_allclose(deb["proportions"][name], true_q["proportions"][name])
        # The raw answer carries the padding: n_pad·|q| extra records over m.
        np.testing.assert_allclose(
            raw["proportions"][name], (true_q["counts"][name] + n_pad * mask.sum()) / m
        )

    # Every window query at every t, and shorter windows via synth_window.
    for t in range(k, horizon + 1):
        mask = Q.pattern_mask(3, lambda d: d[:, 0] != d[:, 2])
        assert Q.pattern_query(synthetic, t, 3, mask, n_pad=n_pad, n=n) == Q.pattern_query(truth, t, 3, mask)
        short = np.array([False, True, True, False])  # exactly one poor month in the last two
        c_syn, p_syn = Q.pattern_query(synthetic, t, 2, short, n_pad=n_pad, n=n, synth_window=3)
        c_true, p_true = Q.pattern_query(truth, t, 2, short)
        assert (c_syn, p_syn) == (c_true, p_true)
    np.testing.assert_array_equal(Q.window_max_error(synthetic, truth, k, n_pad), 0.0)


def test_debiasing_needs_the_right_padding():
    # Debiasing with the wrong n_pad must show up as an error (guards against a no-op test).
    rng = np.random.default_rng(3)
    truth = (rng.random((100, 6)) < 0.3).astype(np.uint8)
    synthetic = np.vstack([truth, periodic_padding(4, 3, 6, 2)])
    wrong = Q.quarterly_poverty(synthetic, n_pad=3, n=100)["counts"]["at_least_1"]
    right = Q.quarterly_poverty(truth)["counts"]["at_least_1"]
    np.testing.assert_array_equal(wrong - right, 7)
    np.testing.assert_allclose(Q.window_max_error(synthetic, truth, 3, 3), 1 / 100)


def test_window_max_error_matches_brute_force():
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 2, size=(40, 6))
    synth = rng.integers(0, 2, size=(70, 6))
    err = Q.window_max_error(synth, truth, 3, 2)
    for t in range(3, 7):
        expected = max(
            abs(a - 2 - b) for a, b in zip(brute_histogram(synth, t, 3, 2), brute_histogram(truth, t, 3, 2))
        )
        assert err[t - 3] == pytest.approx(expected / 40)


def test_errors_name_the_argument():
    panel = np.zeros((4, 6), dtype=np.uint8)
    with pytest.raises(ValueError, match="synth_window"):
        Q.padding_per_pattern(3, k=4, synth_window=3)
    with pytest.raises(ValueError, match="t=7"):
        Q.window_histogram(panel, 7, 3)
    with pytest.raises(ValueError, match="categories"):
        Q.window_histogram(panel + 2, 3, 3)
    with pytest.raises(ValueError, match="binary"):
        Q.cumulative_counts(panel + 2)
    with pytest.raises(ValueError, match="n must"):
        Q.quarterly_poverty(panel, n=0)
    with pytest.raises(ValueError, match="panel"):
        Q.window_histograms(np.zeros(5, dtype=int), 1)
    with pytest.raises(ValueError, match="mask"):
        Q.pattern_query(panel, 3, 3, np.ones(4, dtype=bool))
