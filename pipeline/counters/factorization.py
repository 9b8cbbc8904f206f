"""Factorization counters on an integer lattice: ρ-zCDP continual prefix sums with exact noise.

Matrix mechanism. The prefix sums of x ∈ Z^T are A x, A the T×T lower-triangular all-ones matrix.
A factorization A = B C gives the mechanism B(Cx + z): noise is added to Cx and the result is
mapped back. For prefix sums the square-root factorization B = C = L, L the lower-triangular
Toeplitz matrix of the coefficients of (1 − x)^{−1/2}, c_k = binom(2k, k)/4^k, has near-optimal
max error (Fichtenberger, Henzinger & Upadhyay, "Constant matters: fine-grained error bound on
differentially private continual observation", ICML 2023; Henzinger, Upadhyay & Upadhyay,
"Almost tight error bounds on differentially private continual counting", SODA 2023).

Why a lattice. Cx is real; adding discrete Gaussian noise to a non-integer vector is not covered by
the discrete Gaussian's analysis (the output's fractional part would reveal Cx). So the released
vector is

    y = C_int x + z,   C_int = round(s·C) (integer, lower-triangular, diagonal round(s) ≥ 1),
                       z ~ N_Z(0, σ²)^T i.i.d. (pipeline.privacy.noise, exact sampler)

C_int x ∈ Z^T for integer x, and a neighbouring x' changes it by C_int(x − x'), an integer vector
of L2 norm at most Δ. By Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020), Theorem 14 (the multivariate discrete Gaussian mechanism for an
integer-valued query of L2 sensitivity Δ), y is Δ²/(2σ²)-zCDP; we set σ² = Δ²/(2ρ) (rounded up
to the next float, so the realised Δ²/(2σ²) ≤ ρ). C_int is invertible (triangular, non-zero
diagonal), and everything after is post-processing of y alone:

    S̃ = A C_int⁻¹ y = A x + A C_int⁻¹ z,   returned rounded to the nearest integer.

The decoding is computed from y (float64 forward substitution, then a running sum), never as
"true prefix sum + decoded noise", so the output is a deterministic function of the released y.
Error covariance: Var_NZ(σ²) · K Kᵀ with K = A C_int⁻¹ (lower-triangular Toeplitz, coefficients
β = cumulative sums of the power series 1/c_int(x)); per step Var(S̃_t − S_t) = Var_NZ·Σ_{k<t} β_k²
≤ σ²·Σ_{k<t} β_k² (CKS 2020: the discrete Gaussian's variance is below σ²), plus the final
rounding (|error| ≤ 1/2). The scale s cancels: Δ ∝ s and β ∝ 1/s.

Sensitivity Δ² (computed from the columns of C_int, :func:`toeplitz_sensitivity2`):

* ``add_remove``: one increment changes by ±1, so x − x' = ±e_i and Δ² = max_i ‖C_int e_i‖²; for a
  lower-triangular Toeplitz matrix the first column is the longest, Δ² = Σ_{k<T} c_k².
* ``replace``: one user's unit increment moves from time i to time j (x − x' = e_i − e_j), or is
  present in one of the two sequences only (x − x' = ±e_i; in the cumulative synthesizer the
  replacing user may never reach weight b). So Δ² = max(max_i ‖C e_i‖², max_{i≠j} ‖C(e_i − e_j)‖²),
  computed exactly — not 2× the column norm, which overstates it when the columns are correlated.

Two counters share this code (:class:`LatticeToeplitzCounter`):

* :class:`SqrtFactorizationCounter` — the exact square-root factorization over the whole horizon;
  step t costs O(t) time and the state holds O(T) values (short horizons: T up to a few thousand).
* :class:`BandedSqrtCounter` — the square-root coefficients truncated to a band of b (C_int banded
  Toeplitz). C_int x needs the last b increments and the forward substitution the last b − 1
  decoded values, so a step costs O(b) time and memory whatever t is (live streams). For T ≤ b it
  is exactly the square-root factorization. For t ≫ b its error grows like √(t/b): a banded
  Toeplitz factor has Δ²·Var_T ≥ (T − b)/b (Cauchy–Schwarz on the band, see docs/synthesizers.md),
  so the band must grow with the horizon to stay near the square-root factorization.

Why not buffered linear Toeplitz (BLT) factors (Dvijotham, McMahan, Pillutla, Steinke & Thakurta,
"Efficient and near-optimal noise generation for streaming differential privacy", 2024): a BLT
factor is a rational power series with decaying real coefficients, and an integer power series
that is rational is eventually periodic (Fatou's lemma), so no integer C_int with decaying
coefficients has a constant-memory recurrence other than a banded one. A BLT with exact lattice
noise therefore does not exist in this construction; jobs/bench_counters.py compares against
jax-privacy's (real-valued Gaussian) BLT analytically.

State: the last min(t, b) increments (int64), the last decoded values u = C_int⁻¹ y (float64),
the running decoded sum and t. Noise enters y when it is drawn, and only y's decoding is kept, so
restoring a checkpoint never redraws released noise and continues bit for bit.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Mapping

import numpy as np

from pipeline.privacy import noise as _noise  # module reference: tests may swap the sampler
from pipeline.privacy.accounting import check_neighbours
from pipeline.privacy.rng import RandomSource, as_random_source, random_source_from_state

from .tree import HorizonExceededError, _check_horizon, _check_rho

__all__ = [
    "DEFAULT_BAND",
    "DEFAULT_SCALE",
    "BandedSqrtCounter",
    "LatticeToeplitzCounter",
    "SqrtFactorizationCounter",
    "decoder_coefficients",
    "lattice_coefficients",
    "sqrt_coefficients",
    "toeplitz_sensitivity2",
    "unit_rho_max_variance",
]

#: s in C_int = round(s·C). 2^16 keeps the rounding of every coefficient below 0.2% up to
#: T = 10^5 (s·c_k ≥ 2^16/√(πT) ≈ 117) and C_int x well inside int64 for counts up to 2^24.
DEFAULT_SCALE = 1 << 16
#: Band of :class:`BandedSqrtCounter` when none is given: per-step work of a few microseconds.
DEFAULT_BAND = 4096
_INT64_LIMIT = 1 << 62


def sqrt_coefficients(length: int) -> np.ndarray:
    """c_k = binom(2k, k)/4^k, k < length: the power series of (1 − x)^{−1/2} (float64)."""
    k = np.arange(1, int(length), dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2.0 * k - 1.0) / (2.0 * k))])


def lattice_coefficients(coefficients: np.ndarray, scale: int) -> np.ndarray:
    """round(scale·c) as int64; refuses a zero diagonal (C_int must be invertible)."""
    c = np.rint(np.asarray(coefficients, dtype=np.float64) * int(scale)).astype(np.int64)
    if c.size == 0 or c[0] == 0:
        raise ValueError("the lattice factor's diagonal round(scale·c_0) is 0: C_int would be singular")
    if np.any(c < 0):
        raise ValueError("lattice coefficients must be non-negative")
    return c


def toeplitz_sensitivity2(c: np.ndarray, horizon: int, neighbours: str) -> int:
    """Exact Δ² of x ↦ C x for the T×T lower-triangular Toeplitz C with first column c (zero past
    len(c)) and non-negative integer c; see the module docstring for the two relations.

    Columns (0-indexed) i < j, lag l = j − i: ‖C(e_i − e_j)‖² = N(T−i) + N(T−j) − 2 R_l(T−j) with
    N(n) = Σ_{k<n} c_k², R_l(n) = Σ_{m<n} c_m c_{m+l}. With band b = len(c) both saturate once
    n ≥ b, so only n < b and the lags l < b need evaluating (lags ≥ b have R = 0): O(b²) work.
    """
    neighbours = check_neighbours(neighbours)
    T = _check_horizon(horizon)
    c = np.asarray(c, dtype=np.int64)[:T]
    b = c.size
    sq = np.concatenate([[0], np.cumsum(c * c)])  # sq[n] = N(n) for n ≤ b
    single = int(sq[b])  # first column: the longest
    if neighbours == "add_remove" or T == 1:
        return single

    def N(n):  # vectorised N(n) for n ≥ 0
        return sq[np.minimum(n, b)]

    best = single
    # lags ≥ b: the two shifted columns do not overlap; the largest is at the smallest such lag
    if b < T:
        best = max(best, int(sq[b] + N(np.array([T - b]))[0]))
    for lag in range(1, min(b, T)):
        # n = T − j ranges over 1..T − lag; beyond n = b nothing changes
        n = np.arange(1, min(T - lag, b) + 1)
        prod = c[: b - lag] * c[lag:]  # c_m c_{m+l}, m < b − l
        r = np.concatenate([[0], np.cumsum(prod)])
        vals = N(n + lag) + N(n) - 2 * r[np.minimum(n, b - lag)]
        best = max(best, int(vals.max()))
    return best


def decoder_coefficients(c: np.ndarray, horizon: int) -> np.ndarray:
    """β_0..β_{T−1}: the first column of K = A C⁻¹ (cumulative sums of the series 1/c(x))."""
    from scipy.signal import lfilter

    T = _check_horizon(horizon)
    impulse = np.zeros(T)
    impulse[0] = 1.0
    return np.cumsum(lfilter([1.0], np.asarray(c, dtype=np.float64)[:T], impulse))


def _sigma2_for(delta2: int, rho: float) -> float:
    """σ² = Δ²/(2ρ) as a float not below the exact quotient (so Δ²/(2σ²) ≤ ρ)."""
    sigma2 = delta2 / (2.0 * rho)
    if Fraction(sigma2) < Fraction(delta2) / (2 * Fraction(rho)):
        sigma2 = math.nextafter(sigma2, math.inf)
    return sigma2


@functools.lru_cache(maxsize=4096)
def unit_rho_max_variance(horizon: int, neighbours: str = "add_remove", band: int | None = None,
                          scale: int = DEFAULT_SCALE) -> float:
    """ρ·max_t Var(S̃_t − S_t) of a lattice square-root counter (the σ² bound, Var_NZ ≤ σ²):
    Δ²·Σ_{k<T} β_k²/2. Independent of ρ; the max is at t = T (β² terms are added as t grows)."""
    T = _check_horizon(horizon)
    c = lattice_coefficients(sqrt_coefficients(T if band is None else min(band, T)), scale)
    beta = decoder_coefficients(c, T)
    return toeplitz_sensitivity2(c, T, neighbours) * float(np.dot(beta, beta)) / 2.0


class LatticeToeplitzCounter:
    """ρ-zCDP continual counter y = C_int x + z, S̃ = A C_int⁻¹ y (module docstring).

    Same interface as :class:`~pipeline.counters.tree.TreeCounter`: ``update(z) -> S̃_t``,
    ``variance_at``, ``value``, ``get_state``/``from_state``; ``seed`` is None (secure OS
    randomness), an int (tests/simulation only) or a shared RandomSource; ``width`` None (one
    counter, ints) or k independent counters (int64 arrays of shape (k,)).

    Attributes: ``coefficients`` (int64 first column of C_int, length b ≤ T), ``sensitivity2``
    (Δ², exact integer), ``sigma2`` (σ² of every draw), ``rho``, ``neighbours``, ``t``.
    """

    _kind = "lattice_toeplitz_counter"

    def __init__(self, horizon: int, rho: float, coefficients, seed: RandomSource | int | None = None,
                 neighbours: str = "add_remove", width: int | None = None):
        self.horizon = _check_horizon(horizon)
        self.rho = _check_rho(rho)
        self.neighbours = check_neighbours(neighbours)
        if width is not None:
            if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
                raise ValueError(f"width must be None or an int >= 1, got {width!r}")
            width = int(width)
        self.width = width
        c = np.asarray(coefficients)
        if c.ndim != 1 or c.dtype.kind not in "iu":
            raise TypeError("coefficients must be a 1-D integer array")
        c = c.astype(np.int64)[: self.horizon]
        if c[0] <= 0 or np.any(c < 0):
            raise ValueError("coefficients must be non-negative with a positive diagonal c[0]")
        self.coefficients = c
        self.band = int(c.size)
        self.rng = as_random_source(seed)
        self.sensitivity2 = toeplitz_sensitivity2(c, self.horizon, self.neighbours)
        self.sigma2 = _sigma2_for(self.sensitivity2, self.rho)
        try:  # fail at construction, not at the first update
            _noise.exact_sigma2(self.sigma2)
        except ValueError as exc:
            raise ValueError(f"rho={self.rho} gives sigma2={self.sigma2!r}, outside the sampler's range: {exc}") from None
        self._c_abs_sum = int(c.sum())
        self._cf = c.astype(np.float64)
        self._n = 1 if width is None else width
        b = self.band
        self._x = np.zeros((b, self._n), dtype=np.int64)  # ring: x_{t'} at row (t' − 1) mod b
        self._u = np.zeros((b, self._n), dtype=np.float64)  # ring: decoded u_{t'} = (C_int⁻¹ y)_{t'}
        self._sum = np.zeros(self._n, dtype=np.float64)  # Σ_{t' ≤ t} u_{t'}
        self.t = 0

    @property
    def realised_rho(self) -> float:
        """Δ²/(2σ²) from the σ² actually used for the draws (≤ rho, equal up to float rounding)."""
        return float(Fraction(self.sensitivity2) / (2 * Fraction(self.sigma2)))

    # -- the mechanism ----------------------------------------------------------------------
    def update(self, z):
        """Consume the increment of step t = self.t + 1 and return the noisy prefix sum S̃_t."""
        if self.t >= self.horizon:
            raise HorizonExceededError(
                f"update for step {self.t + 1} refused: the counter's horizon is {self.horizon}")
        z = self._check_z(z)
        t, b = self.t + 1, self.band
        m = min(t, b)
        rows = (t - 1 - np.arange(m)) % b  # x_t, x_{t−1}, …, x_{t−m+1}
        x_win = self._x.copy()
        x_win[(t - 1) % b] = z
        bound = int(np.abs(x_win[rows]).max(initial=0)) * self._c_abs_sum
        if bound + 2**40 >= _INT64_LIMIT:  # 2**40: far beyond any noise draw for σ² ≤ 2**80
            raise OverflowError(f"C_int x at step {t} could leave int64 (|x| too large)")
        cx = self.coefficients[:m] @ x_win[rows]  # (C_int x)_t, exact in int64 by the bound above
        y = cx + np.asarray(_noise.discrete_gaussian(self.sigma2, self._n, rng=self.rng), dtype=np.int64)
        # forward substitution: u_t = (y_t − Σ_{k=1}^{m−1} c_k u_{t−k}) / c_0 — a function of y only
        past = self._cf[1:m] @ self._u[rows[1:]] if m > 1 else 0.0
        u = (y.astype(np.float64) - past) / self._cf[0]
        # commit only after everything that can fail has succeeded
        self._x = x_win
        self._u[(t - 1) % b] = u
        self._sum = self._sum + u
        self.t = t
        return self._output()

    def _output(self):
        out = np.rint(self._sum)
        if np.any(np.abs(out) >= 2.0**62):
            raise OverflowError("noisy prefix sum leaves int64")
        out = out.astype(np.int64)
        return int(out[0]) if self.width is None else out

    def _check_z(self, z):
        if self.width is None:
            if isinstance(z, (bool, np.bool_)) or not isinstance(z, (int, np.integer)):
                raise TypeError(f"z must be an int, got {type(z).__name__}")
            if abs(int(z)) >= 2**62:
                raise ValueError(f"z={z} does not fit in int64")
            return np.array([int(z)], dtype=np.int64)
        arr = np.asarray(z)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"z must be an integer array, got dtype {arr.dtype}")
        if arr.shape != (self.width,):
            raise ValueError(f"z must have shape ({self.width},), got {arr.shape}")
        if arr.dtype == np.uint64 and arr.size and arr.max() >= 2**62:
            raise ValueError("z has values that do not fit in int64")
        return arr.astype(np.int64)

    # -- reading ----------------------------------------------------------------------------
    @functools.cached_property
    def _beta(self) -> np.ndarray:
        return decoder_coefficients(self.coefficients, self.horizon)

    def variance_at(self, t: int) -> float:
        """σ²·Σ_{k<t} β_k²: Var(S̃_t − S_t) before the final rounding for the continuous Gaussian,
        and an upper bound for the discrete one used here (Var_NZ(σ²) < σ²)."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 1 <= t <= self.horizon:
            raise ValueError(f"t must be an int in [1, {self.horizon}], got {t!r}")
        beta = self._beta[: int(t)]
        return float(self.sigma2 * np.dot(beta, beta))

    def error_covariance(self) -> np.ndarray:
        """σ² K Kᵀ, K = A C_int⁻¹ (T×T; the covariance of S̃ − S up to Var_NZ/σ² and rounding)."""
        T = self.horizon
        idx = np.arange(T)
        lag = idx[:, None] - idx[None, :]
        K = np.where(lag >= 0, self._beta[np.clip(lag, 0, None)], 0.0)
        return self.sigma2 * (K @ K.T)

    @property
    def value(self):
        """S̃ of the last step consumed (None before the first update)."""
        return None if self.t == 0 else self._output()

    # -- state ------------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        return {"coefficients": self.coefficients.copy()}

    @classmethod
    def _from_params(cls, state: Mapping[str, Any], rng) -> "LatticeToeplitzCounter":
        return cls(state["horizon"], state["rho"], np.asarray(state["coefficients"]), seed=rng,
                   neighbours=state["neighbours"], width=state["width"])

    def get_state(self, include_rng: bool = True) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (see :mod:`pipeline.serialization`)."""
        return {
            "kind": self._kind,
            "horizon": self.horizon,
            "rho": self.rho,
            "neighbours": self.neighbours,
            "width": self.width,
            **self._params(),
            "sigma2": self.sigma2,
            "t": self.t,
            "x": self._x.copy(),
            "u": self._u.copy(),
            "sum": self._sum.copy(),
            "rng": self.rng.get_state() if include_rng else None,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], rng: RandomSource | int | None = None):
        """Restore from :meth:`get_state`; ``rng`` replaces the stored source (needed when the
        state was taken with ``include_rng=False``)."""
        if state.get("kind") != cls._kind:
            raise ValueError(f"state is not a {cls._kind} state (kind={state.get('kind')!r})")
        if rng is None:
            if state.get("rng") is None:
                raise ValueError("state has no random source; pass rng")
            rng = random_source_from_state(state["rng"])
        c = cls._from_params(state, rng)
        if c.sigma2 != state["sigma2"]:  # never mix two noise calibrations in one stream
            raise ValueError(f"stored sigma2={state['sigma2']!r} differs from this version's {c.sigma2!r}")
        t = int(state["t"])
        if not 0 <= t <= c.horizon:
            raise ValueError(f"stored t={t} is outside [0, {c.horizon}]")
        for name, ref in (("x", c._x), ("u", c._u), ("sum", c._sum)):
            arr = np.asarray(state[name])
            if arr.shape != ref.shape or arr.dtype != ref.dtype:
                raise ValueError(f"stored {name} has shape {arr.shape} dtype {arr.dtype}, "
                                 f"expected {ref.shape} {ref.dtype}")
        c._x = np.array(state["x"], dtype=np.int64)
        c._u = np.array(state["u"], dtype=np.float64)
        c._sum = np.array(state["sum"], dtype=np.float64)
        c.t = t
        return c

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(horizon={self.horizon}, rho={self.rho}, neighbours={self.neighbours!r}, "
                f"band={self.band}, width={self.width}, t={self.t})")


class SqrtFactorizationCounter(LatticeToeplitzCounter):
    """The exact square-root factorization on the lattice round(scale·L) over the whole horizon."""

    _kind = "sqrt_factorization_counter"

    def __init__(self, horizon: int, rho: float, seed: RandomSource | int | None = None,
                 neighbours: str = "add_remove", width: int | None = None, scale: int = DEFAULT_SCALE):
        self.scale = _check_scale(scale)
        T = _check_horizon(horizon)
        super().__init__(T, rho, lattice_coefficients(sqrt_coefficients(T), self.scale), seed=seed,
                         neighbours=neighbours, width=width)

    def _params(self) -> dict[str, Any]:
        return {"scale": self.scale}

    @classmethod
    def _from_params(cls, state, rng):
        return cls(state["horizon"], state["rho"], seed=rng, neighbours=state["neighbours"],
                   width=state["width"], scale=state["scale"])


class BandedSqrtCounter(LatticeToeplitzCounter):
    """Square-root coefficients truncated to ``band`` (O(band) time and memory per step)."""

    _kind = "banded_sqrt_counter"

    def __init__(self, horizon: int, rho: float, seed: RandomSource | int | None = None,
                 neighbours: str = "add_remove", width: int | None = None, band: int = DEFAULT_BAND,
                 scale: int = DEFAULT_SCALE):
        if isinstance(band, bool) or not isinstance(band, (int, np.integer)) or band < 1:
            raise ValueError(f"band must be an int >= 1, got {band!r}")
        self.scale = _check_scale(scale)
        T = _check_horizon(horizon)
        self.requested_band = int(band)
        super().__init__(T, rho, lattice_coefficients(sqrt_coefficients(min(int(band), T)), self.scale),
                         seed=seed, neighbours=neighbours, width=width)

    def _params(self) -> dict[str, Any]:
        return {"scale": self.scale, "band": self.requested_band}

    @classmethod
    def _from_params(cls, state, rng):
        return cls(state["horizon"], state["rho"], seed=rng, neighbours=state["neighbours"],
                   width=state["width"], band=state["band"], scale=state["scale"])


def _check_scale(scale) -> int:
    if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)) or not 1 <= scale <= 2**20:
        raise ValueError(f"scale must be an int in [1, 2**20], got {scale!r}")
    return int(scale)
