"""Tests for pipeline.privacy.rng: exact derived draws, state round trips, errors.

Statistical tests use fixed seeds (deterministic) or, for the secure source, fail only at p < 1e-6.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from pipeline.privacy.rng import RandomSource, SecureRandom, SeededRandom, as_random_source, random_source_from_state

P_FAIL = 1e-6
SOURCES = [pytest.param(lambda: SeededRandom(123), id="seeded"), pytest.param(SecureRandom, id="secure")]


def chi2_p(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    return float(stats.chisquare(observed, expected).pvalue)


def binned_uniform_p(x: np.ndarray, high: int, bins: int = 64) -> float:
    """Chi-square p-value of integers in [0, high) against the uniform law, in `bins` equal bins
    (the last may be shorter: its expected share is computed exactly)."""
    width = -(-high // bins)
    idx = x // width
    sizes = np.array([min(width, high - b * width) for b in range(bins)], dtype=np.float64)
    observed = np.bincount(idx, minlength=bins)
    return chi2_p(observed, sizes / high)


@pytest.mark.parametrize("make", SOURCES)
@pytest.mark.parametrize("high", [1, 2, 7, 1000, 2**32 + 3, 3 * 2**61, 2**62 - 1, 2**63 - 1])
def test_integers_uniform(make, high):
    src = make()
    x = src.integers(high, 200_000)
    assert x.dtype == np.int64 and x.shape == (200_000,)
    assert x.min() >= 0 and x.max() < high
    if high == 1:
        assert not x.any()
    elif high <= 1000:
        assert chi2_p(np.bincount(x, minlength=high), np.full(high, 1 / high)) > P_FAIL
    else:
        assert binned_uniform_p(x, high) > P_FAIL


def test_integers_rejection_matters():
    """For high = 3·2**61, 2**64 = 2·high + 2**62: plain `word % high` gives each value below 2**62
    three preimages and every other value two, so it is far from uniform. The binned test rejects
    it, while it accepts the rejection sampler for the same high (above)."""
    high = 3 * 2**61
    w = SeededRandom(5).words(200_000)
    naive = (w % np.uint64(high)).astype(np.int64)
    assert binned_uniform_p(naive, high) < P_FAIL


def test_integers_per_lane_bounds():
    src = SeededRandom(9)
    highs = np.repeat(np.array([2, 3, 10]), 30_000)
    x = src.integers(highs)
    assert np.all(x < highs) and np.all(x >= 0)
    for h in (2, 3, 10):
        counts = np.bincount(x[highs == h], minlength=h)
        assert chi2_p(counts, np.full(h, 1 / h)) > P_FAIL


@pytest.mark.parametrize("make", SOURCES)
@pytest.mark.parametrize("num,den", [(1, 3), (2, 7), (0, 5), (5, 5), (999_999, 1_000_000)])
def test_bernoulli(make, num, den):
    n = 200_000
    b = make().bernoulli(num, den, n)
    assert b.dtype == np.bool_ and b.shape == (n,)
    p = num / den
    k = int(b.sum())
    if p in (0.0, 1.0):
        assert k == p * n
    else:
        assert stats.binomtest(k, n, p).pvalue > P_FAIL


def test_bernoulli_arrays():
    src = SeededRandom(2)
    num = np.repeat([1, 1, 3], 50_000)
    den = np.repeat([2, 4, 4], 50_000)
    b = src.bernoulli(num, den)
    for i, p in enumerate([0.5, 0.25, 0.75]):
        k = int(b[i * 50_000 : (i + 1) * 50_000].sum())
        assert stats.binomtest(k, 50_000, p).pvalue > P_FAIL


@pytest.mark.parametrize("make", SOURCES)
def test_permutation_uniform(make):
    src = make()
    n, reps = 3, 30_000
    perms = list(itertools.permutations(range(n)))
    index = {p: i for i, p in enumerate(perms)}
    counts = np.zeros(len(perms))
    for _ in range(reps):
        counts[index[tuple(src.permutation(n).tolist())]] += 1
    assert chi2_p(counts, np.full(len(perms), 1 / len(perms))) > P_FAIL
    assert sorted(src.permutation(50).tolist()) == list(range(50))


def test_words():
    src = SeededRandom(1)
    w = src.words(100_000)
    assert w.dtype == np.uint64 and w.shape == (100_000,)
    # every bit position is fair
    bits = ((w[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).sum(axis=0).astype(np.int64)
    assert np.all(np.abs(bits - 50_000) < 6 * math.sqrt(25_000))
    assert SecureRandom().words(0).shape == (0,) and src.words(0).dtype == np.uint64
    assert not np.array_equal(SecureRandom().words(4), SecureRandom().words(4))


def test_seeded_state_round_trip():
    src = SeededRandom(77)
    src.words(13)
    src.integers(1000, 7)
    state = json.loads(json.dumps(src.get_state()))  # JSON-serialisable
    expected = (src.words(50), src.integers(10**12, 20), src.bernoulli(1, 3, 20))
    restored = random_source_from_state(state)
    got = (restored.words(50), restored.integers(10**12, 20), restored.bernoulli(1, 3, 20))
    for a, b in zip(expected, got):
        assert np.array_equal(a, b)
    other = SeededRandom(1)
    other.set_state(state)
    assert other.seed == 77 and np.array_equal(other.words(50), expected[0])


def test_same_seed_same_words_different_seed_differs():
    assert np.array_equal(SeededRandom(5).words(10), SeededRandom(5).words(10))
    assert not np.array_equal(SeededRandom(5).words(10), SeededRandom(6).words(10))


def test_secure_state():
    s = SecureRandom()
    assert s.secure and not SeededRandom(1).secure
    assert s.get_state() == {"kind": "secure"}
    assert isinstance(random_source_from_state({"kind": "secure"}), SecureRandom)
    with pytest.raises(ValueError, match="seeded"):
        s.set_state(SeededRandom(1).get_state())
    with pytest.raises(ValueError, match="secure"):
        SeededRandom(1).set_state({"kind": "secure"})
    with pytest.raises(ValueError, match="unknown random source kind"):
        random_source_from_state({"kind": "quantum"})


def test_as_random_source():
    assert isinstance(as_random_source(None), SecureRandom)
    assert isinstance(as_random_source(3), SeededRandom) and as_random_source(np.int64(3)).seed == 3
    src = SeededRandom(4)
    assert as_random_source(src) is src
    for bad in ("3", 3.0, True, [1]):
        with pytest.raises(TypeError, match="rng must be"):
            as_random_source(bad)
    with pytest.raises(TypeError, match="seed must be an int"):
        SeededRandom(1.5)
    assert issubclass(SeededRandom, RandomSource)


def test_argument_errors():
    src = SeededRandom(1)
    with pytest.raises(ValueError, match="high must be at least 1"):
        src.integers(0, 3)
    with pytest.raises(ValueError, match="does not match"):
        src.integers(np.array([2, 3]), 3)
    with pytest.raises(ValueError, match="0 <= num <= den"):
        src.bernoulli(4, 3, 2)
    with pytest.raises(ValueError, match="0 <= num <= den"):
        src.bernoulli(-1, 3, 2)
    assert src.integers(5, 0).shape == (0,)
