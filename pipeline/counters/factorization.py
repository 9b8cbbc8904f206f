"""Square-root factorization counter on an integer lattice: ρ-zCDP prefix sums with exact noise.

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

    y = C_int x + z,   C_int = round(s·C) (integer, lower-triangular, diagonal s ≥ 1),
                       z ~ N_Z(0, σ²)^T i.i.d. (pipeline.privacy.noise, exact sampler)

C_int x ∈ Z^T for integer x, and a neighbouring x' changes it by C_int(x − x'), an integer vector
of L2 norm at most Δ. By Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020), Theorem 14 (the multivariate discrete Gaussian mechanism for a query
with values in Z^T and L2 sensitivity Δ), y is Δ²/(2σ²)-zCDP; σ² = Δ²/(2ρ) (rounded up to the next
float, so the realised Δ²/(2σ²) ≤ ρ). C_int is invertible (triangular, non-zero diagonal), and
everything after is post-processing of y alone:

    S̃ = A C_int⁻¹ y = A x + A C_int⁻¹ z,   returned rounded to the nearest integer.

The noise z is drawn ahead in blocks of steps (``LatticeCounterBase``; i.i.d. and independent of
the data, kept in the state until used). The decoding is computed from y (float64 forward substitution, then a running sum), never as
"true prefix sum + decoded noise", so the output is a deterministic function of the released y.
Error covariance: Var_NZ(σ²)·K Kᵀ with K = A C_int⁻¹ (lower-triangular Toeplitz whose first
column β is the cumulative sums of the power series 1/c_int(x)); per step Var(S̃_t − S_t) =
Var_NZ·Σ_{k<t} β_k² ≤ σ²·Σ_{k<t} β_k² (CKS 2020: the discrete Gaussian's variance is below σ²),
plus the final rounding (|·| ≤ 1/2). The scale s cancels: Δ ∝ s and β ∝ 1/s.

Sensitivity Δ² (computed from the columns of C_int, :func:`toeplitz_delta2`):

* ``add_remove``: one increment changes by ±1, so x − x' = ±e_i and Δ² = max_i ‖C e_i‖²; for a
  lower-triangular Toeplitz matrix the first column is the longest, Δ² = Σ_{k<T} c_k².
* ``replace``: one user's unit increment moves from time i to time j (x − x' = e_i − e_j), or is
  present in one of the two sequences only (x − x' = ±e_i: in the cumulative synthesizer the
  replacing user may never reach weight b). So Δ² = max(max_i ‖C e_i‖², max_{i≠j} ‖C(e_i − e_j)‖²),
  computed exactly — not 2× the column norm, which overstates it for correlated columns.

Cost: step t takes O(t) time and the state holds the T increments and decoded values, so this is
the counter for short horizons (T up to a few thousand); :mod:`pipeline.counters.blt` is the
constant-memory counter for long streams.

State: the increments so far (int64), the decoded values u = C_int⁻¹ y (float64), their running
sum and t. Noise enters y once and only y's decoding is kept, so restoring a checkpoint never
redraws released noise and continues bit for bit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from pipeline.privacy import noise as _noise  # module reference: tests may swap the sampler
from pipeline.privacy.neighbours import check_neighbours
from pipeline.privacy.rng import RandomSource, as_random_source, restore_random_source
from pipeline.validation import check_int, check_rho

from .tree import HorizonExceededError

__all__ = [
    "DEFAULT_SCALE",
    "LatticeCounterBase",
    "SqrtFactorizationCounter",
    "decoder_coefficients",
    "lattice_coefficients",
    "sigma2_for",
    "sqrt_coefficients",
    "toeplitz_delta2",
    "unit_rho_max_variance",
]

#: s in C_int = round(s·C): relative rounding of every coefficient below 0.2% for T ≤ 10^5
#: (s·c_k ≥ 2^16/√(πT) ≈ 117), and C_int x stays in int64 for counts below 2^24 and T ≤ 10^5.
DEFAULT_SCALE = 1 << 16
_INT64_LIMIT = 1 << 62


def sqrt_coefficients(length: int) -> np.ndarray:
    """c_k = binom(2k, k)/4^k, k < length: the power series of (1 − x)^{−1/2} (float64)."""
    k = np.arange(1, int(length), dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2.0 * k - 1.0) / (2.0 * k))])


def lattice_coefficients(coefficients: np.ndarray, scale: int) -> np.ndarray:
    """round(scale·c) as int64; refuses a zero diagonal (C_int must be invertible)."""
    c = np.rint(np.asarray(coefficients, dtype=np.float64) * int(scale)).astype(np.int64)
    if c.size == 0 or c[0] == 0:
        raise ValueError(
            "the lattice factor's diagonal round(scale·c_0) is 0: C_int would be singular"
        )
    return c


def toeplitz_delta2(c: np.ndarray, neighbours: str):
    """Δ² of x ↦ C x, C the T×T lower-triangular Toeplitz matrix with first column c (T = len(c)).

    For columns i < j with lag l = j − i and n = T − j, ‖C(e_i − e_j)‖² = g_l(n) = N(n + l) + N(n)
    − 2 R_l(n), N(n) = Σ_{k<n} c_k², R_l(n) = Σ_{m<n} c_m c_{m+l}. Since g_l(n+1) − g_l(n) =
    c_{n+l}² + c_n² − 2 c_n c_{n+l} = (c_n − c_{n+l})² ≥ 0, the maximum over pairs at lag l is at
    i = 0: Δ²_replace = max(N(T), max_l N(T) + N(T − l) − 2 R_l) with R_l the autocorrelation of c
    at lag l. Integer c: exact in int64 (|c| ≤ 2^20 and T ≤ 2^16 keep sums below 2^56), returned as
    an int. Real c: autocorrelation by FFT, returned as a float rounded up by a relative 1e-9
    (far above the FFT's rounding error), so Δ is never understated.
    """
    neighbours = check_neighbours(neighbours)
    c = np.asarray(c)
    T = c.size
    exact = c.dtype.kind in "iu"
    N = np.cumsum(c.astype(np.int64) ** 2 if exact else c.astype(np.float64) ** 2)
    single = N[-1]
    if neighbours == "add_remove" or T == 1:
        return int(single) if exact else float(single) * (1 + 1e-9)
    lags = np.arange(1, T)
    if exact:
        if T > 1 << 16 or np.abs(c).max() > 1 << 20:
            raise ValueError("exact integer sensitivity needs T <= 2**16 and |c| <= 2**20")
        r_int = np.correlate(c.astype(np.int64), c.astype(np.int64), mode="full")[T:]  # lags 1..T−1
        return int(max(single, (single + N[T - 1 - lags] - 2 * r_int).max()))
    f = np.fft.rfft(c, 2 * T)
    r = np.fft.irfft(f * np.conj(f), 2 * T)[1:T]
    return float(max(single, (single + N[T - 1 - lags] - 2 * r).max())) * (1 + 1e-9)


#: Horizons up to which :func:`decoder_coefficients` runs its filter in numpy (a Python loop over the
#: steps, ~50 ms at 4096) rather than in scipy.signal, whose import alone takes ~1 s (every command
#: that plans a release computes it).
NUMPY_FILTER_MAX_HORIZON = 4096


def decoder_coefficients(c: np.ndarray, horizon: int) -> np.ndarray:
    """β_0..β_{T−1}: the first column of K = A C⁻¹ (cumulative sums of the series 1/c(x))."""
    T = check_int(horizon, "horizon", low=1)
    impulse = np.zeros(T)
    impulse[0] = 1.0
    a = np.asarray(c, dtype=np.float64)[:T]
    if T > NUMPY_FILTER_MAX_HORIZON:
        from scipy.signal import lfilter

        return np.cumsum(lfilter([1.0], a, impulse))
    return np.cumsum(_all_pole_filter(a, impulse))


def _all_pole_filter(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``scipy.signal.lfilter([1.0], a, x)`` bit for bit: the same direct form II transposed filter
    (numerator zero-padded to len(a), both normalised by a[0]) in the same order of operations, so
    β, and every σ² and budget split computed from it, is unchanged."""
    n_taps = a.size
    b = np.zeros(n_taps)
    b[0] = 1.0
    b, a = b / a[0], a / a[0]
    if n_taps == 1:  # no delays: a gain
        return x * b[0]
    delays = np.zeros(n_taps - 1)
    y = np.empty(x.size)
    for n, xn in enumerate(x):
        y[n] = delays[0] + b[0] * xn
        delays[:-1] = delays[1:] + xn * b[1:-1] - y[n] * a[1:-1]
        delays[-1] = xn * b[-1] - y[n] * a[-1]
    return y


def sigma2_for(delta2, rho: float) -> float:
    """σ² = Δ²/(2ρ) as a float not below the exact quotient, so Δ²/(2σ²) ≤ ρ."""
    sigma2 = float(delta2) / (2.0 * rho)
    if Fraction(sigma2) < Fraction(delta2) / (2 * Fraction(rho)):
        sigma2 = math.nextafter(sigma2, math.inf)
    return sigma2


@functools.lru_cache(maxsize=4096)
def unit_rho_max_variance(
    horizon: int, neighbours: str = "add_remove", scale: int = 1 << 16
) -> float:
    """ρ·max_t Var(S̃_t − S_t) of :class:`SqrtFactorizationCounter` (the σ² bound): Δ²·Σ_{k<T} β_k²/2.
    Independent of ρ; the max is at t = T since every step adds a β² term."""
    T = check_int(horizon, "horizon", low=1)
    c = lattice_coefficients(sqrt_coefficients(T), scale)
    beta = decoder_coefficients(c, T)
    return toeplitz_delta2(c, check_neighbours(neighbours)) * float(np.dot(beta, beta)) / 2.0


def check_width(width) -> int | None:
    if width is None:
        return None
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"width must be None or an int >= 1, got {width!r}")
    return int(width)


def check_increment(z, width: int | None) -> np.ndarray:
    """One step's increment as an int64 array of shape (width or 1,), refusing non-integers."""
    if width is None:
        if isinstance(z, (bool, np.bool_)) or not isinstance(z, (int, np.integer)):
            raise TypeError(f"z must be an int, got {type(z).__name__}")
        if abs(int(z)) >= _INT64_LIMIT:
            raise ValueError(f"z={z} is too large (|z| must be below 2**62)")
        return np.array([int(z)], dtype=np.int64)
    arr = np.asarray(z)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"z must be an integer array, got dtype {arr.dtype}")
    if arr.shape != (width,):
        raise ValueError(f"z must have shape ({width},), got {arr.shape}")
    if arr.size and (arr.max() >= _INT64_LIMIT or arr.min() <= -_INT64_LIMIT):
        raise ValueError("z has values that are too large (|z| must be below 2**62)")
    return arr.astype(np.int64)


def check_sampler_range(sigma2: float, rho: float) -> None:
    """Fail at construction, not at the first update, if the sampler cannot use σ²."""
    try:
        _noise.exact_sigma2(sigma2)
    except ValueError as exc:
        raise ValueError(
            f"rho={rho} gives sigma2={sigma2!r}, outside the sampler's range: {exc}"
        ) from None


def rounded_output(total: np.ndarray, width: int | None):
    """Round the decoded prefix sums to integers (post-processing); int or int64 array."""
    out = np.rint(total)
    if np.any(np.abs(out) >= 2.0**62):
        raise OverflowError("noisy prefix sum leaves int64")
    out = out.astype(np.int64)
    return int(out[0]) if width is None else out


def check_stored_step(t, horizon: int) -> int:
    t = int(t)
    if not 0 <= t <= horizon:
        raise ValueError(f"stored t={t} is outside [0, {horizon}]")
    return t


def check_variance_step(t, horizon: int) -> int:
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 1 <= t <= horizon:
        raise ValueError(f"t must be an int in [1, {horizon}], got {t!r}")
    return int(t)


#: steps of noise drawn per call of the exact sampler (its ~1 ms fixed cost dominated a step)
NOISE_BLOCK = 256


class LatticeCounterBase:
    """What the lattice counters share: the realised ρ, the horizon check, and noise drawn ahead.

    Noise z_t is drawn in blocks of up to ``NOISE_BLOCK`` steps per sampler call; a step uses the
    block's next row. The draws are i.i.d. N_Z(0, σ²) and independent of the data, so drawing them
    early does not change the mechanism's law; the rows not yet used are state (``pending``), so a
    restore continues bit for bit and never redraws a step's noise.
    """

    sensitivity2: float
    sigma2: float
    horizon: int
    t: int
    width: int | None
    rng: Any
    _pending: np.ndarray

    def _lanes(self) -> int:
        return 1 if self.width is None else self.width

    def _next_noise(self) -> tuple[np.ndarray, np.ndarray]:
        """This step's draw (one row of ``lanes`` values) and the rows left after it; a new block is
        drawn when none is left. The caller commits the rest only once the step succeeds."""
        pending = self._pending
        if pending.shape[0] == 0:
            steps = min(NOISE_BLOCK, self.horizon - self.t)
            draws = _noise.discrete_gaussian(self.sigma2, steps * self._lanes(), rng=self.rng)
            pending = np.asarray(draws, dtype=np.int64).reshape(steps, self._lanes())
        return pending[0], pending[1:]

    def _restore_pending(self, state: Mapping[str, Any]) -> None:
        pending = np.asarray(state.get("pending", np.zeros((0, self._lanes()))), dtype=np.int64)
        if (
            pending.ndim != 2
            or pending.shape[1] != self._lanes()
            or pending.shape[0] > self.horizon - self.t
        ):
            raise ValueError(
                f"stored pending noise has shape {pending.shape}, expected "
                f"(≤ {self.horizon - self.t}, {self._lanes()})"
            )
        self._pending = pending.copy()

    @property
    def realised_rho(self) -> float:
        """Δ²/(2σ²) from the σ² the draws use (≤ rho, equal up to the float rounding of σ²)."""
        return float(Fraction(self.sensitivity2) / (2 * Fraction(self.sigma2)))

    def _refuse_past_horizon(self) -> None:
        if self.t >= self.horizon:
            raise HorizonExceededError(
                f"update for step {self.t + 1} refused: the counter's horizon is {self.horizon}"
            )


class SqrtFactorizationCounter(LatticeCounterBase):
    """ρ-zCDP continual counter y = C_int x + z, S̃ = A C_int⁻¹ y (module docstring).

    Same interface as :class:`~pipeline.counters.tree.TreeCounter`: ``update(z) -> S̃_t``,
    ``variance_at``, ``value``, ``get_state``/``from_state``; ``seed`` is None (secure OS
    randomness), an int (tests/simulation only) or a shared RandomSource; ``width`` None (one
    counter, ints) or k independent counters (int64 arrays of shape (k,)).

    Attributes: ``coefficients`` (int64 first column of C_int), ``sensitivity2`` (Δ², exact
    integer), ``sigma2`` (σ² of every draw), ``realised_rho`` (Δ²/(2σ²)), ``rho``, ``t``.
    """

    _kind = "sqrt_factorization_counter"

    def __init__(
        self,
        horizon: int,
        rho: float,
        seed: RandomSource | int | None = None,
        neighbours: str = "add_remove",
        width: int | None = None,
        scale: int = DEFAULT_SCALE,
    ):
        self.horizon = check_int(horizon, "horizon", low=1)
        self.rho = check_rho(rho)
        self.neighbours = check_neighbours(neighbours)
        self.width = check_width(width)
        self.scale = check_int(scale, "scale", low=1, high=2**20)
        self.rng = as_random_source(seed)
        self.coefficients = lattice_coefficients(sqrt_coefficients(self.horizon), self.scale)
        self.sensitivity2 = toeplitz_delta2(self.coefficients, self.neighbours)
        self.sigma2 = sigma2_for(self.sensitivity2, self.rho)
        check_sampler_range(self.sigma2, self.rho)
        self._cf = self.coefficients.astype(np.float64)
        self._c_sum = int(self.coefficients.sum())
        n = 1 if self.width is None else self.width
        self._x = np.zeros((self.horizon, n), dtype=np.int64)  # increments x_1..x_t (row t − 1)
        self._u = np.zeros((self.horizon, n), dtype=np.float64)  # decoded u = C_int⁻¹ y
        self._sum = np.zeros(n, dtype=np.float64)  # Σ_{t' ≤ t} u_{t'}
        self._pending = np.zeros((0, n), dtype=np.int64)  # noise of the next steps, drawn ahead
        self.t = 0

    # -- the mechanism ----------------------------------------------------------------------
    def update(self, z):
        """Consume the increment of step t = self.t + 1 and return the noisy prefix sum S̃_t."""
        self._refuse_past_horizon()
        z = check_increment(z, self.width)
        t = self.t + 1
        x = self._x[:t].copy()
        x[t - 1] = z
        if int(np.abs(x).max()) * self._c_sum >= _INT64_LIMIT - 2**40:  # 2**40: room for the noise
            raise OverflowError(f"C_int x at step {t} could leave int64 (increments too large)")
        cx = self.coefficients[t - 1 :: -1] @ x  # (C_int x)_t = Σ_k c_{t−k} x_k, exact int64
        noise, rest = self._next_noise()
        y = cx + noise
        # forward substitution from y alone: u_t = (y_t − Σ_{k<t} c_{t−k} u_k) / c_0
        past = self._cf[t - 1 : 0 : -1] @ self._u[: t - 1] if t > 1 else 0.0
        u = (y.astype(np.float64) - past) / self._cf[0]
        # commit only after everything that can fail has succeeded
        self._x[t - 1] = z
        self._u[t - 1] = u
        self._sum = self._sum + u
        self._pending = rest
        self.t = t
        return rounded_output(self._sum, self.width)

    # -- reading ----------------------------------------------------------------------------
    @functools.cached_property
    def beta(self) -> np.ndarray:
        """First column of K = A C_int⁻¹ (length T)."""
        return decoder_coefficients(self.coefficients, self.horizon)

    def variance_at(self, t: int) -> float:
        """σ²·Σ_{k<t} β_k²: Var(S̃_t − S_t) before the final rounding for the continuous Gaussian,
        and an upper bound for the discrete one used here (Var_NZ(σ²) < σ²)."""
        b = self.beta[: check_variance_step(t, self.horizon)]
        return float(self.sigma2 * np.dot(b, b))

    def error_covariance(self) -> np.ndarray:
        """σ² K Kᵀ (T×T): the covariance of S̃ − S, up to Var_NZ/σ² and the final rounding."""
        lag = np.subtract.outer(np.arange(self.horizon), np.arange(self.horizon))
        K = np.where(lag >= 0, self.beta[np.clip(lag, 0, None)], 0.0)
        return self.sigma2 * (K @ K.T)

    @property
    def value(self):
        """S̃ of the last step consumed (None before the first update)."""
        return None if self.t == 0 else rounded_output(self._sum, self.width)

    # -- state ------------------------------------------------------------------------------
    def get_state(self, include_rng: bool = True) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (see :mod:`pipeline.serialization`)."""
        return {
            "kind": self._kind,
            "horizon": self.horizon,
            "rho": self.rho,
            "neighbours": self.neighbours,
            "width": self.width,
            "scale": self.scale,
            "sigma2": self.sigma2,
            "t": self.t,
            "x": self._x.copy(),
            "u": self._u.copy(),
            "sum": self._sum.copy(),
            "pending": self._pending.copy(),
            "rng": self.rng.get_state() if include_rng else None,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], rng: RandomSource | int | None = None):
        """Restore from :meth:`get_state`; ``rng`` replaces the stored source (needed when the
        state was taken with ``include_rng=False``)."""
        rng = restore_random_source(state, cls._kind, rng)
        c = cls(
            state["horizon"],
            state["rho"],
            seed=rng,
            neighbours=state["neighbours"],
            width=state["width"],
            scale=state["scale"],
        )
        if c.sigma2 != state["sigma2"]:  # never mix two noise calibrations in one stream
            raise ValueError(
                f"stored sigma2={state['sigma2']!r} differs from this version's {c.sigma2!r}"
            )
        c.t = check_stored_step(state["t"], c.horizon)
        for name in ("x", "u", "sum"):
            ref = getattr(c, "_" + name)
            arr = np.asarray(state[name])
            if arr.shape != ref.shape or arr.dtype != ref.dtype:
                raise ValueError(
                    f"stored {name} has shape {arr.shape} dtype {arr.dtype}, "
                    f"expected {ref.shape} {ref.dtype}"
                )
            setattr(c, "_" + name, arr.copy())
        c._restore_pending(state)
        return c

    def __repr__(self) -> str:
        return (
            f"SqrtFactorizationCounter(horizon={self.horizon}, rho={self.rho}, "
            f"neighbours={self.neighbours!r}, width={self.width}, t={self.t})"
        )
