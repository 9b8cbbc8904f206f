"""Buffered linear Toeplitz (BLT) counter: constant time and memory per step, exact noise.

Factor. A BLT is the lower-triangular Toeplitz matrix C with c_0 = 1 and c_k = Σ_j ω_j θ_j^{k−1}
(k ≥ 1) for d buffers (θ_j, ω_j) (Dvijotham, McMahan, Pillutla, Steinke & Thakurta, "Efficient and
near-optimal noise generation for streaming differential privacy", 2024; McMahan et al., "Don't
use tree aggregation, use BLTs", 2024). (Cx)_t = x_t + Σ_j ω_j B_{j,t} with buffers
B_{j,t+1} = θ_j B_{j,t} + x_t, so Cx needs d numbers of state. The buffers here fit the
square-root factorization: (1 − x)^{−1/2} = (1/π)∫_0^1 τ^{−1/2}(1 − τ)^{−1/2}/(1 − τx) dτ is a
continuous mixture of geometric series, so θ_j = 1 − e^{−u_j} on a grid of u_j from 0.3 to
ln T + 0.5 and non-negative least-squares ω_j for c_1..c_{T−1} (:func:`blt_parameters`); six
buffers stay within 0.2% of the square-root factorization's max error up to T = 10^5
(jobs/bench/bench_counters.py). θ_j and ω_j are dyadic rationals a_j/2^48, w_j/2^48, so C is exact.

Lattice. An integer factor with decaying coefficients and a constant-memory recurrence is
necessarily banded (an integer power series that is rational is eventually periodic, Fatou's
lemma), so the linear construction of :mod:`pipeline.counters.factorization` cannot carry a BLT.
Instead the released query is an integer-valued *rounding* of s·Cx computed exactly in integers:

    h_{j,t+1} = ⌊a_j h_{j,t} / 2^48⌋ + 2^F x_t             (Python integers, h_{j,1} = 0)
    q_t(x)    = s·x_t + ⌊Σ_j w_j s h_{j,t} / 2^{48+F}⌋
    y_t       = q_t(x) + z_t,   z ~ N_Z(0, σ²)^T i.i.d.

With e_{j,t} = h_{j,t} − 2^F B_{j,t}: e_{j,t+1} = θ_j e_{j,t} − frac ∈ (−1/(1 − θ_j), 0], so
r_t = q_t(x) − s(Cx)_t ∈ (−1 − ε, 0] with ε = s Σ_j ω_j / (2^F (1 − θ_j)) ≤ 2^−20 (F chosen so).
For neighbours x, x': ‖q(x) − q(x')‖ ≤ s‖C(x − x')‖ + ‖r(x) − r(x')‖ ≤ s Δ_C + (1 + ε)√T =: Δ_q,
every |r_t(x) − r_t(x')| < 1 + ε. q is integer-valued with L2 sensitivity Δ_q, so by Canonne,
Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020), Theorem 14,
y is Δ_q²/(2σ²)-zCDP; σ² = Δ_q²/(2ρ). Δ_C is the exact Toeplitz sensitivity of C for the
relation (:func:`pipeline.counters.factorization.toeplitz_delta2`, replace included); with
s = 2^24 the rounding term inflates Δ by under 2·10^−5 relative for T ≤ 10^5.

Decoding (post-processing of y alone, float64): u = C⁻¹y by forward substitution through C's own
buffers (u_t = y_t − Σ_j ω_j G_{j,t}, G_{j,t+1} = θ_j G_{j,t} + u_t), S̃_t = round(Σ_{k≤t} u_k / s).
S̃ − S = A C⁻¹ (z + r) / s: the noise term has covariance Var_NZ(σ²)/s² · K Kᵀ, K = A C⁻¹
(first column β), and the rounding residual adds a deterministic |·| ≤ (1 + ε)·Σ_k |β_k| / s
(below 10^−4 counts for T ≤ 10^5), then the final rounding ≤ 1/2.

State: the integer buffers h (exact), the float decoder buffers G, the running sum and t, and the
noise drawn for steps not yet released (``LatticeCounterBase``: blocks of up to ``NOISE_BLOCK``
steps per call of the exact sampler, whose ~1 ms fixed cost dominated the step when it was called
once per step). A step's draw z_t is absorbed into G and the sum; the rows drawn ahead are state,
so a restore continues bit for bit and never redraws a step's noise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.privacy.neighbours import check_neighbours
from pipeline.privacy.rng import RandomSource, as_random_source, restore_random_source
from pipeline.validation import check_int, check_rho

from .factorization import (
    LatticeCounterBase,
    check_increment,
    check_sampler_range,
    check_stored_step,
    check_variance_step,
    check_width,
    rounded_output,
    sigma2_for,
    sqrt_coefficients,
    toeplitz_delta2,
)

__all__ = [
    "BLTCounter",
    "DEFAULT_BUFFERS",
    "DEFAULT_BLT_SCALE",
    "blt_parameters",
    "blt_coefficients",
]

DEFAULT_BUFFERS = 6
DEFAULT_BLT_SCALE = 1 << 24
_PARAM_BITS = 48  # θ_j = a_j / 2^48, ω_j = w_j / 2^48
_EPS_BITS = 20  # ε ≤ 2^−20


@functools.lru_cache(maxsize=64)
def blt_parameters(
    horizon: int, buffers: int = DEFAULT_BUFFERS
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Dyadic BLT numerators (a_j, w_j), θ_j = a_j/2^48, ω_j = w_j/2^48, fitting the square-root
    coefficients over ``horizon`` steps (module docstring). Deterministic."""
    from scipy.optimize import nnls

    T = check_int(horizon, "horizon", low=1)
    if (
        isinstance(buffers, bool)
        or not isinstance(buffers, (int, np.integer))
        or not 1 <= buffers <= 16
    ):
        raise ValueError(f"buffers must be an int in [1, 16], got {buffers!r}")
    u = np.linspace(0.3, math.log(T) + 0.5, int(buffers))
    theta = -np.expm1(-u)
    target = sqrt_coefficients(max(T, 2))[1:]
    powers = theta[None, :] ** np.arange(target.size)[:, None]
    omega = nnls(powers, target)[0]
    one = 1 << _PARAM_BITS
    a = tuple(int(v) for v in np.rint(theta * one))
    w = tuple(int(v) for v in np.rint(omega * one))
    if not all(0 <= v < one for v in a):
        raise ValueError("BLT decay parameters must lie in [0, 1)")
    return a, w


def blt_coefficients(a, w, horizon: int) -> np.ndarray:
    """c_0..c_{T−1} of the BLT (float64 of the exact dyadic parameters)."""
    theta = np.asarray(a, dtype=np.float64) / 2.0**_PARAM_BITS
    omega = np.asarray(w, dtype=np.float64) / 2.0**_PARAM_BITS
    k = np.arange(max(horizon - 1, 0))
    return np.concatenate([[1.0], (omega[None, :] * theta[None, :] ** k[:, None]).sum(axis=1)])


class BLTCounter(LatticeCounterBase):
    """ρ-zCDP continual counter with a BLT factor, O(buffers) time and memory per step.

    Same interface as :class:`~pipeline.counters.tree.TreeCounter` (``update``, ``variance_at``,
    ``value``, ``get_state``/``from_state``, ``seed``, ``width``). Attributes: ``theta``, ``omega``
    (floats of the dyadic parameters), ``delta_c2`` (Δ_C² of the real factor), ``sensitivity2``
    (Δ_q² of the released integer query), ``sigma2``, ``realised_rho``, ``t``.
    """

    _kind = "blt_counter"

    def __init__(
        self,
        horizon: int,
        rho: float,
        seed: RandomSource | int | None = None,
        neighbours: str = "add_remove",
        width: int | None = None,
        buffers: int = DEFAULT_BUFFERS,
        scale: int = DEFAULT_BLT_SCALE,
    ):
        self.horizon = check_int(horizon, "horizon", low=1)
        self.rho = check_rho(rho)
        self.neighbours = check_neighbours(neighbours)
        self.width = check_width(width)
        self.scale = check_int(scale, "scale", low=1, high=2**40)
        self.buffers = int(buffers)
        self._a, self._w = blt_parameters(self.horizon, self.buffers)
        self.theta = np.array(self._a, dtype=np.float64) / 2.0**_PARAM_BITS
        self.omega = np.array(self._w, dtype=np.float64) / 2.0**_PARAM_BITS
        self.rng = as_random_source(seed)
        # F: fractional bits of the integer buffers, so that ε = sΣω/(2^F(1−θ)) ≤ 2^−20
        spread = self.scale * float(np.sum(self.omega / (1.0 - self.theta))) + 1.0
        self.frac_bits = max(0, math.ceil(math.log2(spread))) + _EPS_BITS
        self.delta_c2 = toeplitz_delta2(
            blt_coefficients(self._a, self._w, self.horizon), self.neighbours
        )
        eps = 2.0**-_EPS_BITS
        delta_q = (
            self.scale * math.sqrt(self.delta_c2) + (1.0 + eps) * math.sqrt(self.horizon)
        ) * (1 + 1e-12)
        self.sensitivity2 = delta_q * delta_q
        self.sigma2 = sigma2_for(self.sensitivity2, self.rho)
        check_sampler_range(self.sigma2, self.rho)
        n = 1 if self.width is None else self.width
        self._h = [[0] * n for _ in range(self.buffers)]  # exact integer buffers h_{j}, per lane
        self._g = np.zeros((self.buffers, n), dtype=np.float64)  # decoder buffers G_j
        self._sum = np.zeros(n, dtype=np.float64)  # Σ u
        self._pending = np.zeros((0, n), dtype=np.int64)  # noise of the next steps, drawn ahead
        self.t = 0

    # -- the mechanism ----------------------------------------------------------------------
    def update(self, z):
        """Consume the increment of step t = self.t + 1 and return the noisy prefix sum S̃_t."""
        self._refuse_past_horizon()
        x = [int(v) for v in check_increment(z, self.width)]
        s, shift, F = self.scale, _PARAM_BITS + self.frac_bits, self.frac_bits
        # the integer query q_t(x), exact (Python integers)
        q = [
            s * x[i] + (sum(self._w[j] * s * self._h[j][i] for j in range(self.buffers)) >> shift)
            for i in range(len(x))
        ]
        noise, rest = self._next_noise()
        y = np.array([float(qi + int(zi)) for qi, zi in zip(q, noise)])
        # decoding from y alone: u_t = y_t − Σ_j ω_j G_j, then G_j ← θ_j G_j + u_t
        u = y - self.omega @ self._g
        total = self._sum + u
        out = rounded_output(total / s, self.width)
        # commit
        self._h = [
            [((self._a[j] * self._h[j][i]) >> _PARAM_BITS) + (x[i] << F) for i in range(len(x))]
            for j in range(self.buffers)
        ]
        self._g = self.theta[:, None] * self._g + u[None, :]
        self._sum = total
        self._pending = rest
        self.t += 1
        return out

    # -- reading ----------------------------------------------------------------------------
    @functools.cached_property
    def beta(self) -> np.ndarray:
        """First column of K = A C⁻¹ in count units × s (the decoder applied to an impulse)."""
        u = np.empty(self.horizon)
        g = np.zeros(self.buffers)
        for k in range(self.horizon):
            u[k] = (1.0 if k == 0 else 0.0) - self.omega @ g
            g = self.theta * g + u[k]
        return np.cumsum(u)

    def variance_at(self, t: int) -> float:
        """σ²/s²·Σ_{k<t} β_k²: the noise part of Var(S̃_t − S_t) (an upper bound for the discrete
        Gaussian); the rounding residual (< 10^−4) and the final rounding come on top."""
        b = self.beta[: check_variance_step(t, self.horizon)]
        return float(self.sigma2 * np.dot(b, b) / self.scale**2)

    def residual_bound(self, t: int | None = None) -> float:
        """Deterministic bound on the rounding residual's part of |S̃_t − S_t| before the final
        rounding: (1 + ε)·Σ_{k<t} |β_k| / s (module docstring; below 10⁻⁴ counts for T ≤ 10⁵)."""
        t = self.horizon if t is None else check_variance_step(t, self.horizon)
        return float((1.0 + 2.0**-_EPS_BITS) * np.abs(self.beta[:t]).sum() / self.scale)

    @property
    def value(self):
        return None if self.t == 0 else rounded_output(self._sum / self.scale, self.width)

    # -- state ------------------------------------------------------------------------------
    def get_state(self, include_rng: bool = True) -> dict[str, Any]:
        return {
            "kind": self._kind,
            "horizon": self.horizon,
            "rho": self.rho,
            "neighbours": self.neighbours,
            "width": self.width,
            "buffers": self.buffers,
            "scale": self.scale,
            "sigma2": self.sigma2,
            "t": self.t,
            "h": [list(row) for row in self._h],
            "g": self._g.copy(),
            "sum": self._sum.copy(),
            "pending": self._pending.copy(),
            "rng": self.rng.get_state() if include_rng else None,
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], rng: RandomSource | int | None = None
    ) -> BLTCounter:
        rng = restore_random_source(state, cls._kind, rng)
        c = cls(
            state["horizon"],
            state["rho"],
            seed=rng,
            neighbours=state["neighbours"],
            width=state["width"],
            buffers=state["buffers"],
            scale=state["scale"],
        )
        if c.sigma2 != state["sigma2"]:
            raise ValueError(
                f"stored sigma2={state['sigma2']!r} differs from this version's {c.sigma2!r}"
            )
        c.t = check_stored_step(state["t"], c.horizon)
        h = [[int(v) for v in row] for row in state["h"]]
        if len(h) != c.buffers or any(len(row) != len(c._h[0]) for row in h):
            raise ValueError("stored buffers h do not match buffers × width")
        for name in ("g", "sum"):
            ref, arr = getattr(c, "_" + name), np.asarray(state[name])
            if arr.shape != ref.shape or arr.dtype != ref.dtype:
                raise ValueError(
                    f"stored {name} has shape {arr.shape} dtype {arr.dtype}, expected {ref.shape} {ref.dtype}"
                )
            setattr(c, "_" + name, arr.copy())
        c._h = h
        c._restore_pending(state)
        return c

    def __repr__(self) -> str:
        return (
            f"BLTCounter(horizon={self.horizon}, rho={self.rho}, neighbours={self.neighbours!r}, "
            f"buffers={self.buffers}, width={self.width}, t={self.t})"
        )
