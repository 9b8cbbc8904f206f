"""Square-root factorization and BLT counters (pipeline.counters.factorization / .blt).

Statistical checks use fixed seeds and tolerances from the sampling distribution of a variance
estimate: for R i.i.d. normal-like errors the sample variance has relative standard error
√(2/(R − 1)) (the χ² distribution's variance); Z = 5 of those is the tolerance, and each test also
checks that a noise scale off by √2 (variance × 2 or ÷ 2) would be rejected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.counters import (
    BLTCounter,
    HorizonExceededError,
    SqrtFactorizationCounter,
    TreeCounter,
    counter_from_state,
    make_counter,
)
from pipeline.counters.blt import blt_coefficients, blt_parameters
from pipeline.counters.factorization import lattice_coefficients, sqrt_coefficients, toeplitz_delta2
from pipeline.privacy import noise as noise_module
from pipeline.privacy.rng import as_random_source
from pipeline.serialization import dumps_state, loads_state

Z = 5.0


def dense_toeplitz(c):
    T = len(c)
    return np.array([[c[i - j] if i >= j else 0 for j in range(T)] for i in range(T)])


def brute_delta2(C, neighbours):
    """max ‖C d‖² over d = ±e_i (and e_i − e_j, i ≠ j, for replace), by enumeration."""
    T = C.shape[1]
    single = max((C[:, i] ** 2).sum() for i in range(T))
    if neighbours == "add_remove":
        return single
    return max([single] + [((C[:, i] - C[:, j]) ** 2).sum() for i in range(T) for j in range(T) if i != j])


# ------------------------------------------------------------------------------------------
# sensitivity
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T", [1, 2, 3, 7, 12, 25])
@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_toeplitz_sensitivity_equals_enumeration(T, neighbours):
    for scale in (3, 1 << 16):
        c = lattice_coefficients(sqrt_coefficients(T), scale)
        assert toeplitz_delta2(c, neighbours) == brute_delta2(dense_toeplitz(c).astype(object), neighbours)
    # real coefficients (the BLT's): never below the exact value, at most 1e-9 above
    a, w = blt_parameters(T, 4)
    cf = blt_coefficients(a, w, T)
    exact = brute_delta2(dense_toeplitz(cf), neighbours)
    assert exact <= toeplitz_delta2(cf, neighbours) <= exact * (1 + 2e-9)


def test_replace_sensitivity_is_computed_not_doubled():
    """Moving a unit increment changes C x by C(e_i − e_j), whose columns overlap: the exact
    maximum lies strictly between the single-column norm and twice it."""
    for T in (12, 120):
        c = lattice_coefficients(sqrt_coefficients(T), 1 << 16)
        single, moved = toeplitz_delta2(c, "add_remove"), toeplitz_delta2(c, "replace")
        assert single < moved < 2 * single
        k = SqrtFactorizationCounter(T, 0.3, seed=0, neighbours="replace")
        assert k.sensitivity2 == moved


def test_decoder_coefficients_equal_scipy_lfilter_bit_for_bit():
    """β (hence every σ² and budget split computed from it) is what scipy.signal.lfilter gave before
    the filter ran in numpy: equal bit for bit, on either side of the horizon where scipy takes
    over, for lattice and real coefficients."""
    from scipy.signal import lfilter

    from pipeline.counters.factorization import NUMPY_FILTER_MAX_HORIZON, decoder_coefficients

    edge = NUMPY_FILTER_MAX_HORIZON
    for T in [*range(1, 200), 1000, edge, edge + 1]:
        for c in (lattice_coefficients(sqrt_coefficients(T + 2), 1 << 16),
                  lattice_coefficients(sqrt_coefficients(T), 7), 1.37 * sqrt_coefficients(T)):
            impulse = np.zeros(T)
            impulse[0] = 1.0
            before = np.cumsum(lfilter([1.0], np.asarray(c, dtype=np.float64)[:T], impulse))
            assert decoder_coefficients(c, T).tobytes() == before.tobytes(), T


def test_the_variance_bound_does_not_import_scipy_signal():
    """Every command that plans a release computes the bound; importing scipy.signal for it took
    ~1 s of each (`close`, `query`, `plan`, the releaser's start)."""
    import subprocess
    import sys

    code = ("import sys; from pipeline.counters.factorization import unit_rho_max_variance; "
            "unit_rho_max_variance(1000, 'replace'); print('scipy.signal' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------
# calibration: the ρ recomputed from the noise actually drawn equals the target
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [SqrtFactorizationCounter, BLTCounter])
@pytest.mark.parametrize("neighbours", ["add_remove", "replace"])
def test_privacy_recomputed_from_drawn_noise_equals_target(cls, neighbours, monkeypatch):
    drawn = []
    real = noise_module.discrete_gaussian

    def recording(sigma2, size, rng=None):
        drawn.extend([sigma2] * size)  # one entry per value drawn (the BLT draws a block of steps per call)
        return real(sigma2, size, rng=rng)

    monkeypatch.setattr(noise_module, "discrete_gaussian", recording)
    T, rho = 9, 0.37
    k = cls(T, rho, seed=1, neighbours=neighbours)
    for t in range(T):
        k.update(t % 3)
    assert len(drawn) == T and len(set(drawn)) == 1  # one draw per step, one calibration
    if cls is SqrtFactorizationCounter:
        delta2 = brute_delta2(dense_toeplitz(k.coefficients).astype(object), neighbours)
    else:  # Δ_q = s·Δ_C + (1 + ε)√T with Δ_C by enumeration (module docstring of pipeline.counters.blt)
        delta_c2 = brute_delta2(dense_toeplitz(blt_coefficients(*blt_parameters(T, k.buffers), T)), neighbours)
        delta2 = (k.scale * math.sqrt(delta_c2) + (1 + 2**-20) * math.sqrt(T)) ** 2
    recomputed = delta2 / (2 * drawn[0])  # Canonne, Kamath & Steinke 2020, Theorem 14
    # equal to the target up to the counters' deliberate round-ups (σ² to the next float; the
    # BLT's FFT sensitivity by a relative 1e-9), which only ever lower the realised ρ
    assert rho * (1 - 3e-9) <= recomputed <= rho
    assert k.realised_rho <= rho and k.realised_rho == pytest.approx(rho, rel=1e-12)


# ------------------------------------------------------------------------------------------
# error: empirical covariance against the derived one
# ------------------------------------------------------------------------------------------

def run_lanes(counter, T, R, seed):
    """Errors S̃ − S of R independent lanes (width=R) fed the same random increments."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 50, size=T)
    err = np.empty((R, T))
    for t in range(T):
        out = counter.update(np.full(R, x[t], dtype=np.int64))
        err[:, t] = out - x[: t + 1].sum()
    return err


@pytest.mark.parametrize("cls, T, R", [(SqrtFactorizationCounter, 16, 4000), (BLTCounter, 24, 3000)])
def test_error_covariance_matches_derivation(cls, T, R):
    """Var(S̃_t − S_t) = Var_NZ·(K Kᵀ)_tt, K = A C⁻¹ (CKS 2020: Var_NZ(σ²) < σ², relatively
    below 1e-30 at these σ²; the final rounding adds < 1/4 against variances above 40)."""
    k = cls(T, 0.02, seed=11, width=R)
    err = run_lanes(k, T, R, seed=3)
    expected = np.array([k.variance_at(t) for t in range(1, T + 1)])
    assert expected.min() > 40
    ratio = err.var(axis=0, ddof=1) / expected
    tol = Z * math.sqrt(2.0 / (R - 1))
    assert np.all(np.abs(ratio - 1) <= tol), ratio
    # had σ been off by √2 (derived variance half or double the true one), every step would fail
    assert np.all(np.abs(ratio / 2 - 1) > tol) and np.all(np.abs(2 * ratio - 1) > tol)
    assert np.all(np.abs(err.mean(axis=0)) <= Z * np.sqrt(expected / R))  # unbiased
    if cls is SqrtFactorizationCounter:  # off-diagonal: the correlation structure of K Kᵀ
        cov = k.error_covariance()
        sd = np.sqrt(np.diag(cov))
        emp = np.cov(err, rowvar=False)
        corr_err = np.abs(emp - cov) / np.outer(sd, sd)
        assert corr_err.max() <= Z * math.sqrt(2.0 / R), corr_err.max()


# ------------------------------------------------------------------------------------------
# accuracy against the tree (analytic, equal ρ)
# ------------------------------------------------------------------------------------------

def max_var(counter):
    return max(counter.variance_at(t) for t in range(1, counter.horizon + 1))


@pytest.mark.parametrize("T, ratio", [(12, 1.87), (120, 2.50), (1000, 2.91)])
def test_sqrt_factorization_max_error_against_tree(T, ratio):
    """The issue's figures: tree max std / square-root max std at equal ρ (add_remove)."""
    tree = TreeCounter(T, 1.0)
    sq = SqrtFactorizationCounter(T, 1.0)
    assert math.sqrt(max_var(tree) / max_var(sq)) == pytest.approx(ratio, abs=0.01)


@pytest.mark.parametrize("T", [12, 1000, 100_000])
def test_blt_is_within_a_percent_of_the_square_root_factorization(T):
    blt = BLTCounter(T, 1.0)
    if T <= 1000:
        ref = max_var(SqrtFactorizationCounter(T, 1.0))
    else:  # Σβ² of the real square-root factor: the lattice one is within 1e-6 of it
        from pipeline.counters.factorization import decoder_coefficients

        c = sqrt_coefficients(T)
        beta = decoder_coefficients(c, T)
        ref = (c @ c) * (beta @ beta) / 2.0
    assert blt.variance_at(T) <= 1.01**2 * ref
    assert blt.variance_at(T) == pytest.approx(max_var(blt) if T <= 1000 else blt.variance_at(T))


def test_blt_state_does_not_grow_with_time_or_horizon():
    sizes = []
    for T in (100, 10_000):
        k = BLTCounter(T, 1.0, seed=0)
        for _ in range(50):
            k.update(7)
        s = k.get_state()
        sizes.append((len(s["h"]), s["g"].shape, s["sum"].shape))
    assert sizes[0] == sizes[1] == (6, (6, 1), (1,))


# ------------------------------------------------------------------------------------------
# outputs, state, validation
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [SqrtFactorizationCounter, BLTCounter])
def test_huge_budget_returns_exact_prefix_sums(cls):
    k = cls(30, 1e9, seed=2)
    x = np.random.default_rng(0).integers(0, 1000, 30)
    assert [k.update(int(v)) for v in x] == np.cumsum(x).tolist()


@pytest.mark.parametrize("cls", [SqrtFactorizationCounter, BLTCounter])
@pytest.mark.parametrize("cut", [0, 1, 7, 20])
def test_state_round_trip_bit_for_bit(cls, cut):
    x = np.random.default_rng(cut).integers(0, 30, 20)
    ref = cls(20, 0.2, seed=9)
    ref_out = [ref.update(int(v)) for v in x]
    src = as_random_source(9)
    k = cls(20, 0.2, seed=src)
    for v in x[:cut]:
        k.update(int(v))
    blob = dumps_state({"c": k.get_state(include_rng=False), "rng": src.get_state()})
    back = loads_state(blob)
    from pipeline.privacy.rng import random_source_from_state

    r = counter_from_state(back["c"], rng=random_source_from_state(back["rng"]))
    assert [r.update(int(v)) for v in x[cut:]] == ref_out[cut:]
    assert dumps_state(r.get_state()) == dumps_state(ref.get_state())


@pytest.mark.parametrize("cls", [SqrtFactorizationCounter, BLTCounter])
def test_validation_and_horizon(cls):
    with pytest.raises(ValueError, match="rho"):
        cls(5, 0.0)
    with pytest.raises(ValueError, match="neighbours"):
        cls(5, 1.0, neighbours="bounded")
    with pytest.raises(ValueError, match="width"):
        cls(5, 1.0, width=0)
    k = cls(2, 1.0, seed=0)
    with pytest.raises(TypeError, match="z must be an int"):
        k.update(1.5)
    k.update(1)
    k.update(2)
    with pytest.raises(HorizonExceededError, match="horizon"):
        k.update(0)
    w = cls(3, 1.0, seed=0, width=2)
    with pytest.raises(ValueError, match="shape"):
        w.update(np.array([1, 2, 3]))
    state = k.get_state()
    state["sigma2"] = state["sigma2"] * 2
    with pytest.raises(ValueError, match="sigma2"):
        cls.from_state(state)
    with pytest.raises(ValueError, match="kind"):
        cls.from_state({"kind": "tree_counter"})


def test_make_counter_names():
    assert isinstance(make_counter("tree", 4, 1.0, seed=0), TreeCounter)
    assert isinstance(make_counter("factorization", 4, 1.0, seed=0), SqrtFactorizationCounter)
    with pytest.raises(ValueError, match="counter"):
        make_counter("binary", 4, 1.0)


@pytest.mark.parametrize("cls", [SqrtFactorizationCounter, BLTCounter])
def test_noise_is_drawn_in_blocks_and_a_restore_mid_block_continues_bit_for_bit(cls, monkeypatch):
    """The lattice counters call the exact sampler once per NOISE_BLOCK steps (its ~1 ms fixed cost
    dominated the step), never more values than steps, and the rows drawn ahead are state: a counter
    restored in the middle of a block (with another source) releases exactly what the uninterrupted
    one does — no step's noise is redrawn."""
    from pipeline.counters.factorization import NOISE_BLOCK

    calls = []
    real = noise_module.discrete_gaussian

    def recording(sigma2, size, rng=None):
        calls.append(size)
        return real(sigma2, size, rng=rng)

    monkeypatch.setattr(noise_module, "discrete_gaussian", recording)
    T = NOISE_BLOCK + 40
    ref = cls(T, 0.5, seed=3, neighbours="replace", width=2)
    out_ref = [ref.update([t % 2, 1]) for t in range(T)]
    assert calls == [2 * NOISE_BLOCK, 2 * 40]
    k = cls(T, 0.5, seed=3, neighbours="replace", width=2)
    out = [k.update([t % 2, 1]) for t in range(100)]
    state = k.get_state(include_rng=False)
    assert state["pending"].shape == (NOISE_BLOCK - 100, 2)
    back = cls.from_state(state, rng=12345)  # another source: only a new block would use it
    out += [back.update([t % 2, 1]) for t in range(100, NOISE_BLOCK)]
    assert all(np.array_equal(a, b) for a, b in zip(out, out_ref[:NOISE_BLOCK]))


def test_counter_names_and_the_automatic_choice():
    """``blt`` is a counter choice; ``auto`` is the square-root factorization up to BLT_ABOVE_HORIZON
    steps and the BLT above (constant time and memory per step)."""
    from pipeline.counters import BLT_ABOVE_HORIZON, resolve_counter

    assert isinstance(make_counter("blt", 4, 1.0, seed=0), BLTCounter)
    assert isinstance(make_counter("auto", BLT_ABOVE_HORIZON, 1.0, seed=0), SqrtFactorizationCounter)
    assert isinstance(make_counter("auto", BLT_ABOVE_HORIZON + 1, 1.0, seed=0), BLTCounter)
    assert resolve_counter("tree", 10**6) == "tree"
    with pytest.raises(ValueError, match="counter"):
        resolve_counter("sqrt", 10)
