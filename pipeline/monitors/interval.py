"""OutsideIntervalMonitor / RangeMonitor (Ghazi et al., "PREM: Privately answering
statistical queries with relative error", arXiv 2502.14809: Alg. 1 approx-DP, Alg. 4 pure-DP) over a
fixed histogram, and the streaming :class:`BandMonitor` whose records are users.

Answers are the strings ``"between"``, ``"above"``, ``"below"``.

Noise: discrete Laplace (footnote 3 of Ghazi et al. allows it: the queries are integer counts).
Privacy:
* approx (Alg. 1): ε from target charging, :func:`calibration.outside_interval_privacy` — each call
  that touches a record is a-DP; non-Between answers are a NotPrior target (q = 1/(1+e^a)); a
  record leaves the active set at the first non-Between answer it contributes to. Proposition 2.2
  only gives ε = O(a·log(1/δ)); we use Theorem B.4 of Cohen–Lyu with explicit constants instead.
* pure (Alg. 4): ε = a·Γ (Proposition C.3).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.privacy.laws import DiscreteLaplaceLaw
from pipeline.privacy.noise import discrete_laplace, used_scale
from pipeline.validation import check_int, check_real

from . import calibration as cal
from .state import StatefulMixin

__all__ = [
    "OutsideIntervalMonitor",
    "OutsideIntervalMonitorPure",
    "BandMonitor",
    "BETWEEN",
    "ABOVE",
    "BELOW",
]

BETWEEN, ABOVE, BELOW = "between", "above", "below"


def _two_sided_margin(law: DiscreteLaplaceLaw, per_draw: float) -> int:
    """Smallest integer c ≥ 0 with P(|N| > c) = 2ρ^{c+1}/(1+ρ) ≤ per_draw."""
    # 2ρ^{c+1}/(1+ρ) ≤ p  ⇔  c + 1 ≥ ln(p(1+ρ)/2)/ln ρ
    need = math.log(per_draw * (1.0 + law.rho) / 2.0) / law.log_rho
    return max(0, math.ceil(need - 1.0 - 1e-12))


def _check_histogram(histogram: Any) -> np.ndarray:
    h = np.asarray(histogram)
    if h.ndim != 1 or h.size == 0:
        raise ValueError("histogram must be a non-empty 1-d array")
    if h.dtype.kind not in "iu":
        raise TypeError(f"histogram must hold integers, got dtype {h.dtype}")
    if h.min() < 0:
        raise ValueError("histogram must be non-negative")
    return h.astype(np.int64)


def _check_mask(f: Any, size: int, name: str = "f") -> np.ndarray:
    """f as a boolean mask over the domain (a mask of length ``size`` or an array of element ids)."""
    arr = np.asarray(f)
    if arr.dtype == bool:
        if arr.shape != (size,):
            raise ValueError(f"{name} as a mask must have shape ({size},), got {arr.shape}")
        return arr
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be a boolean mask or a 1-d array of element ids")
    if arr.size and (arr.min() < 0 or arr.max() >= size):
        raise ValueError(f"{name} ids must lie in [0, {size})")
    mask = np.zeros(size, dtype=bool)
    mask[arr.astype(np.int64)] = True
    return mask


def _check_band(lo: Any, hi: Any) -> tuple[float, float]:
    lo = check_real(lo, "lo")
    hi = check_real(hi, "hi")
    if not lo < hi:
        raise ValueError(f"lo must be below hi, got lo={lo}, hi={hi}")
    return lo, hi


class _LaplaceIntervalNoise(StatefulMixin):
    """Noise, privacy and utility margin shared by the approximate-DP interval monitors: one
    discrete-Laplace draw DLap(a) per query (pmf ∝ e^{−a|x|}), target charging per record."""

    a: float

    def _after_restore(self) -> None:
        self._scale = used_scale(1.0 / self.a)
        self.noise_law = DiscreteLaplaceLaw(self._scale)

    def privacy(self, delta: float, neighbours: str = "replace") -> cal.TCTBound:
        return cal.outside_interval_privacy(self.a, delta, neighbours)

    def utility_margin(self, rounds: int, beta: float) -> int:
        """Proposition 2.2's C for the discrete noise: the smallest c with P(|N| > c) ≤ β/R, so that
        w.p. ≥ 1−β over R rounds: Between ⇒ lo − c ≤ f ≤ hi + c; Above ⇒ f ≥ hi − c; Below ⇒ f ≤ lo + c.
        (The paper's (1/a)·ln(R/β) is for the continuous Laplace; the discrete tail
        2ρ^{c+1}/(1+ρ) can exceed e^{−ac} by a factor < 2/(1+e^{−a}), hence this exact version.)"""
        rounds = check_int(rounds, "rounds", low=1)
        beta = check_real(beta, "beta", low=0.0, high=1.0, low_open=True, high_open=True)
        return _two_sided_margin(self.noise_law, beta / rounds)


class OutsideIntervalMonitor(_LaplaceIntervalNoise):
    """Ghazi et al. Algorithm 1 (approximate DP). State: histogram h, noise parameter a, active set.

    query(f, lo, hi): f̂ = f(h|S_active) + DLap(a) (pmf ∝ e^{−a|x|}); Between if lo < f̂ < hi, else
    remove f^{-1}(1) from the active set and answer Above (f̂ ≥ hi) or Below.
    """

    _state_fields = ("histogram", "a", "active_mask", "queries", "outside")

    def __init__(self, histogram: Any, a: float, active: Any = None, seed: Any = None):
        self.histogram = _check_histogram(histogram)
        self.a = check_real(a, "a", low=0.0, high=1.0, low_open=True)
        size = self.histogram.size
        self.active_mask = (
            np.ones(size, dtype=bool)
            if active is None
            else _check_mask(active, size, "active").copy()
        )
        self._rng_init(seed)
        self.queries = 0
        self.outside = 0
        self._after_restore()

    @classmethod
    def from_target(
        cls, histogram: Any, epsilon: float, delta: float, neighbours: str = "replace", **kw
    ):
        return cls(histogram, cal.calibrate_outside_interval(epsilon, delta, neighbours), **kw)

    def true_value(self, f: Any) -> int:
        """f(h|S_active) (curator-side; for tests and diagnostics, never publish)."""
        mask = _check_mask(f, self.histogram.size)
        return int(self.histogram[mask & self.active_mask].sum())

    def query(self, f: Any, lo: float, hi: float) -> str:
        mask = _check_mask(f, self.histogram.size)
        lo, hi = _check_band(lo, hi)
        value = int(self.histogram[mask & self.active_mask].sum())
        noisy = value + int(discrete_laplace(self._scale, 1, self._source)[0])
        self.queries += 1
        if lo < noisy < hi:
            return BETWEEN
        self.active_mask &= ~mask
        self.outside += 1
        return ABOVE if noisy >= hi else BELOW


class OutsideIntervalMonitorPure(StatefulMixin):
    """Ghazi et al. Algorithm 4 (pure DP, SVT-based). η ~ Lap(2/a) at start and after every Above/Below;
    Above if f + Lap(4/a) ≥ hi + η; else Below if f + Lap(4/a) ≤ lo − η (a second, independent draw:
    the proof reduces each comparison to its own AboveThreshold query, which draws its own noise);
    else Between. Halts (raises) after Γ = ``max_outside`` Above/Below answers. ε = a·Γ (Prop. C.3).
    """

    _state_fields = ("histogram", "a", "max_outside", "active_mask", "eta", "counter", "queries")

    def __init__(
        self, histogram: Any, a: float, max_outside: int, active: Any = None, seed: Any = None
    ):
        self.histogram = _check_histogram(histogram)
        self.a = check_real(a, "a", low=0.0, low_open=True)
        self.max_outside = check_int(max_outside, "max_outside", low=1)
        size = self.histogram.size
        self.active_mask = (
            np.ones(size, dtype=bool)
            if active is None
            else _check_mask(active, size, "active").copy()
        )
        self._rng_init(seed)
        self.counter = 0
        self.queries = 0
        self._after_restore()
        self.eta = int(discrete_laplace(self._scale_eta, 1, self._source)[0])

    @classmethod
    def from_target(cls, histogram: Any, epsilon: float, max_outside: int, **kw):
        return cls(
            histogram, cal.calibrate_outside_interval_pure(epsilon, max_outside), max_outside, **kw
        )

    def _after_restore(self) -> None:
        self._scale_eta = used_scale(2.0 / self.a)
        self._scale_nu = used_scale(4.0 / self.a)

    @property
    def privacy(self):
        return cal.outside_interval_pure_privacy(self.a, self.max_outside)

    def utility_margin(self, rounds: int, beta: float, runs: int = 1) -> int:
        """Explicit Proposition C.3: C = c_η + c_ν (:meth:`utility_margins`). The paper's
        C = (6/a)·ln(R/β)."""
        return sum(self.utility_margins(rounds, beta, runs))

    def utility_margins(self, rounds: int, beta: float, runs: int = 1) -> tuple[int, int]:
        """(c_η, c_ν) with runs·(Γ+1)·P(|η| > c_η) ≤ β/2 and 2R·P(|ν| > c_ν) ≤ β/2 (exact discrete
        tails): one run of the monitor draws η at most Γ + 1 times (at the start and after each of
        ≤ Γ Above/Below answers); ``runs`` independent monitors (PREM's calls, each with its own η)
        asked R queries in all."""
        rounds = check_int(rounds, "rounds", low=1)
        runs = check_int(runs, "runs", low=1)
        beta = check_real(beta, "beta", low=0.0, high=1.0, low_open=True, high_open=True)
        c_eta = _two_sided_margin(
            DiscreteLaplaceLaw(self._scale_eta), beta / (2.0 * runs * (self.max_outside + 1))
        )
        c_nu = _two_sided_margin(DiscreteLaplaceLaw(self._scale_nu), beta / (4.0 * rounds))
        return c_eta, c_nu

    def true_value(self, f: Any) -> int:
        mask = _check_mask(f, self.histogram.size)
        return int(self.histogram[mask & self.active_mask].sum())

    def query(self, f: Any, lo: float, hi: float) -> str:
        if self.counter >= self.max_outside:
            raise RuntimeError(
                "OutsideIntervalMonitorPure has halted after max_outside Above/Below answers"
            )
        mask = _check_mask(f, self.histogram.size)
        lo, hi = _check_band(lo, hi)
        value = int(self.histogram[mask & self.active_mask].sum())
        nu = discrete_laplace(self._scale_nu, 2, self._source)
        self.queries += 1
        if value + int(nu[0]) >= hi + self.eta:
            answer = ABOVE
        elif value + int(nu[1]) <= lo - self.eta:
            answer = BELOW
        else:
            return BETWEEN
        self.counter += 1
        self.eta = int(discrete_laplace(self._scale_eta, 1, self._source)[0])
        self.active_mask &= ~mask
        return answer


class BandMonitor(_LaplaceIntervalNoise):
    """Streaming band alerts where the records are users: at each step, "is the number of active users
    satisfying the step's predicate (e.g. value == v) inside [lo, hi]?". Algorithm 1 of Ghazi et al. with
    the active set over users: a user leaves it once it contributed to an Above/Below answer.

    Privacy is that of :class:`OutsideIntervalMonitor` (same per-record target charging: one hit per
    user, two under replace), :func:`calibration.outside_interval_privacy`; independent of the number
    of steps.
    """

    _state_fields = ("n", "a", "active", "steps", "outside")

    def __init__(self, n_users: int, a: float, seed: Any = None):
        self.n = check_int(n_users, "n_users", low=0)
        self.a = check_real(a, "a", low=0.0, high=1.0, low_open=True)
        self._rng_init(seed)
        self.active = np.ones(self.n, dtype=bool)
        self.steps = 0
        self.outside = 0
        self._after_restore()

    @classmethod
    def from_target(
        cls, n_users: int, epsilon: float, delta: float, neighbours: str = "replace", **kw
    ):
        return cls(n_users, cal.calibrate_outside_interval(epsilon, delta, neighbours), **kw)

    def update_mask(self, mask: Any, lo: float, hi: float) -> str:
        """``mask[j]`` = whether user j satisfies this step's predicate."""
        m = np.asarray(mask)
        if m.dtype != bool or m.shape != (self.n,):
            raise ValueError(f"mask must be a boolean array of shape ({self.n},)")
        answer = self.release_count(int((m & self.active).sum()), lo, hi)
        if answer != BETWEEN:
            self.active &= ~m
        return answer

    def release_count(self, count: int, lo: float, hi: float) -> str:
        """One step from the count of *active* users satisfying the predicate (the stream's
        releaser; the workers retire the contributing users after an Above/Below answer)."""
        lo, hi = _check_band(lo, hi)
        count = check_int(count, "count", low=0)
        noisy = count + int(discrete_laplace(self._scale, 1, self._source)[0])
        self.steps += 1
        if lo < noisy < hi:
            return BETWEEN
        self.outside += 1
        return ABOVE if noisy >= hi else BELOW

    def update(self, values: Any, value: int, lo: float, hi: float) -> str:
        """Band alert for "number of active users whose value at this step is ``value``"."""
        vals = np.asarray(values)
        if vals.shape != (self.n,):
            raise ValueError(f"values must have shape ({self.n},), got {vals.shape}")
        value = check_int(value, "value")
        return self.update_mask(vals == value, lo, hi)
