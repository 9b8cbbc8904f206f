"""Exact tail probabilities of the discrete noise laws the monitors use, and the sparse-sampling
helpers built on them (Binomial / geometric / conditional-tail draws from a :class:`RandomSource`).

Everything here is curator-side arithmetic: no private data, no I/O.

Laws (all on the integers, or the integers plus one atom for the capped law):

* :class:`DiscreteLaplaceLaw` ``DL(s)``: pmf ∝ exp(−|x|/s); with ρ = e^{−1/s},
  P(X ≥ y) = ρ^y/(1+ρ) for integer y ≥ 1 and P(X ≥ y) = 1 − ρ^{1−y}/(1+ρ) for y ≤ 0.
* :class:`DiscreteGaussianLaw` ``DG(σ²)``: pmf ∝ exp(−x²/(2σ²)); the normaliser by Poisson summation
  (Jacobi theta), the tail by a direct sum truncated where the remaining terms are below e^{−80}
  of the sum.
* :class:`CappedSumLaw` ``W + min(V, D)`` with W ~ DL(s_w), V ~ DL(s_v), D real: the noise of
  ThresholdMonitor (Kaplan–Mansour–Stemmer, Alg. 3 step 3a–3c: w ~ Lap(10Δ), v̄ = min(v, Δ)). Tails in closed form
  as sums of geometric series (see :meth:`CappedSumLaw.log_sf`).

Probabilities are returned as natural logs where they can be tiny (1e−20 is routine: β/(m·|X|)).
These float tails set thresholds and utility bounds (public numbers, computed from public
parameters). Every *draw* of the zero-count shortcut instead uses ``sf_interval``: the same tail as
a rigorous interval at any precision (:mod:`pipeline.privacy.exact`), so the sampled law is
exactly the intended one.
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR
from fractions import Fraction

import numpy as np
from scipy import special

from pipeline.privacy.exact import (
    PI_DIGITS,
    Interval,
    ProbabilityFn,
    _ctx,
    binomial_exact,
    geometric_exact,
    pi_interval,
)
from pipeline.privacy.noise import exact_scale, exact_sigma2
from pipeline.privacy.rng import RandomSource

__all__ = [
    "DiscreteLaplaceLaw",
    "DiscreteGaussianLaw",
    "CappedSumLaw",
    "upper_quantile",
    "lower_quantile",
    "binomial_draw",
    "geometric_draw",
    "choose_absent_ids",
]

_NEG_INF = -math.inf


def _log_add(a: float, b: float) -> float:
    if a == _NEG_INF:
        return b
    if b == _NEG_INF:
        return a
    m = max(a, b)
    return m + math.log1p(math.exp(-abs(a - b)))


def _log_geom(log_r: float, a: float, b: float) -> float:
    """ln Σ_{u=a}^{b} r^u for integers a ≤ b (b = +inf allowed when r < 1); −inf for an empty range."""
    if b < a:
        return _NEG_INF
    if a == -math.inf:
        raise ValueError("lower end must be finite")
    n = b - a + 1
    if log_r == 0.0:
        if math.isinf(n):
            raise ValueError("divergent geometric series")
        return math.log(n)
    if log_r < 0.0:
        one_minus_rn = 1.0 if math.isinf(n) else -math.expm1(n * log_r)
        return a * log_r + math.log(one_minus_rn) - math.log(-math.expm1(log_r))
    if math.isinf(n):
        raise ValueError("divergent geometric series")
    x = n * log_r
    log_expm1_x = x + math.log1p(-math.exp(-x)) if x > 30.0 else math.log(math.expm1(x))
    return a * log_r + log_expm1_x - math.log(math.expm1(log_r))


class DiscreteLaplaceLaw:
    """DL(s): P(X = x) = ((1−ρ)/(1+ρ))·ρ^{|x|}, ρ = e^{−1/s} (the sampler ``discrete_laplace(s)``)."""

    def __init__(self, scale: float):
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be positive and finite, got {scale!r}")
        self.scale = float(scale)
        self.log_rho = -1.0 / self.scale
        self.rho = math.exp(self.log_rho)
        self._log1p_rho = math.log1p(self.rho)
        self._log_norm = math.log(-math.expm1(self.log_rho)) - self._log1p_rho
        self._inv_scale = 1 / exact_scale(self.scale)  # what the exact sampler uses
        self._sf_cache: dict[tuple[int, int], Interval] = {}

    def rho_interval(self, digits: int) -> Interval:
        """ρ = e^{−1/s} as an interval."""
        return (-Interval.of(self._inv_scale, digits)).exp()

    def sf_interval(self, y, digits: int) -> Interval:
        """P(X ≥ y) for real y as a rigorous interval (see :mod:`pipeline.privacy.exact`)."""
        big_y = math.ceil(Fraction(y))
        key = (big_y, digits)
        if key not in self._sf_cache:
            inv = Interval.of(self._inv_scale, digits)
            one_plus_rho = 1 + (-inv).exp()
            if big_y >= 1:
                value = (-(inv * big_y)).exp() / one_plus_rho
            else:
                value = 1 - (-(inv * (1 - big_y))).exp() / one_plus_rho
            if len(self._sf_cache) > 256:
                self._sf_cache.clear()
            self._sf_cache[key] = value.clamp01()
        return self._sf_cache[key]

    def log_sf(self, y: float) -> float:
        """ln P(X ≥ y) for real y."""
        big_y = math.ceil(y)
        if big_y >= 1:
            return big_y * self.log_rho - self._log1p_rho
        return math.log1p(-math.exp((1 - big_y) * self.log_rho - self._log1p_rho))

    def log_cdf(self, x: float) -> float:
        """ln P(X ≤ x) for real x (symmetry: P(X ≤ x) = P(X ≥ −⌊x⌋))."""
        return self.log_sf(-math.floor(x))

    def log_pmf_sum(self, lo: float, hi: float, c: float) -> float:
        """ln Σ_{v=lo}^{hi} P(X = v)·e^{c·v} (lo may be −inf; hi may be +inf when it converges)."""
        total = _NEG_INF
        # v ≤ −1: P ∝ ρ^{−v}; with u = −v ≥ 1 the term is exp(u·(ln ρ − c)).
        if lo <= -1:
            u_lo = max(1.0, -hi)
            u_hi = -lo  # may be +inf
            if u_lo <= u_hi:
                total = _log_add(total, _log_geom(self.log_rho - c, u_lo, u_hi))
        # v ≥ 0: term exp(v·(ln ρ + c)).
        if hi >= 0:
            v_lo = max(0.0, lo)
            if v_lo <= hi:
                total = _log_add(total, _log_geom(self.log_rho + c, v_lo, hi))
        return total + self._log_norm if total != _NEG_INF else _NEG_INF

    def sample_conditional_tail(self, source: RandomSource, t: int, size: int) -> np.ndarray:
        """Exact draws of X conditioned on X ≥ t for an integer t ≥ 1: t + G with P(G ≥ g) = ρ^g
        (memoryless), G drawn exactly (:func:`pipeline.privacy.exact.geometric_exact`)."""
        if t < 1:
            raise ValueError("t must be at least 1")
        return np.asarray(
            [t + geometric_exact(source, self.rho_interval) for _ in range(int(size))],
            dtype=np.int64,
        )


class DiscreteGaussianLaw:
    """DG(σ²): P(X = x) ∝ exp(−x²/(2σ²)) (the sampler ``discrete_gaussian(σ²)``)."""

    def __init__(self, sigma2: float):
        if not (sigma2 > 0 and math.isfinite(sigma2)):
            raise ValueError(f"sigma2 must be positive and finite, got {sigma2!r}")
        self.sigma2 = float(sigma2)
        sigma = math.sqrt(self.sigma2)
        if sigma >= 1.0:
            # Poisson summation: Σ_x e^{−x²/2σ²} = √(2π)σ·(1 + 2Σ_{k≥1} e^{−2π²σ²k²}).
            corr = sum(math.exp(-2.0 * math.pi**2 * self.sigma2 * k * k) for k in range(1, 4))
            self._log_z = 0.5 * math.log(2.0 * math.pi * self.sigma2) + math.log1p(2.0 * corr)
        else:
            xs = np.arange(-60, 61, dtype=np.float64)
            self._log_z = float(special.logsumexp(-xs * xs / (2.0 * self.sigma2)))
        self._exact_sigma2 = exact_sigma2(self.sigma2)  # what the exact sampler uses
        self._sf_cache: dict[tuple[int, int], Interval] = {}
        self._norm_cache: dict[int, Interval] = {}

    def _normaliser(self, digits: int) -> Interval:
        """Σ_x e^{−x²/(2σ²)}: for σ² ≥ 1 by Poisson summation, √(2πσ²)·(1 + 2Σ_{k≥1} e^{−2π²σ²k²})
        (a few terms), else directly, 1 + 2Σ_{x≥1} e^{−x²/(2σ²)}."""
        if digits not in self._norm_cache:
            s2 = self._exact_sigma2
            if s2 >= 1 and digits <= PI_DIGITS - 10:
                pi = pi_interval(digits)
                theta = 1 + 2 * _gauss_sum(pi * pi * (2 * s2), 1, digits)
                value = (pi * (2 * s2)).sqrt() * theta
            else:
                value = 1 + 2 * _gauss_sum(Interval.of(1 / (2 * s2), digits), 1, digits)
            self._norm_cache[digits] = value
        return self._norm_cache[digits]

    def sf_interval(self, y, digits: int) -> Interval:
        """P(X ≥ y) for real y as a rigorous interval; the tail sum is cut where the rest is below
        10^−digits of it and the rest bounded by a geometric series (:func:`_gauss_sum`)."""
        big_y = math.ceil(Fraction(y))
        key = (big_y, digits)
        if key not in self._sf_cache:
            c = Interval.of(1 / (2 * self._exact_sigma2), digits)
            if big_y >= 1:
                value = _gauss_sum(c, big_y, digits) / self._normaliser(digits)
            else:
                value = 1 - _gauss_sum(c, 1 - big_y, digits) / self._normaliser(digits)
            if len(self._sf_cache) > 256:
                self._sf_cache.clear()
            self._sf_cache[key] = value.clamp01()
        return self._sf_cache[key]

    def _log_tail_from(self, start: int) -> float:
        """ln Σ_{x ≥ start} P(X = x) for an integer start ≥ 0."""
        s2 = self.sigma2
        # Beyond start + m the terms are below e^{−80} of the first one (ratio per step ≤ e^{−start/σ²}).
        m1 = math.ceil(math.sqrt(160.0 * s2)) + 2
        m2 = math.ceil(80.0 * s2 / start) + 2 if start > 0 else m1
        m = min(m1, m2)
        xs = np.arange(start, start + m, dtype=np.float64)
        return float(special.logsumexp(-xs * xs / (2.0 * s2))) - self._log_z

    def log_sf(self, y: float) -> float:
        big_y = math.ceil(y)
        if big_y >= 1:
            return self._log_tail_from(big_y)
        # P(X ≥ y) = 1 − P(X ≤ y − 1) = 1 − P(X ≥ 1 − y)
        return math.log1p(-math.exp(self._log_tail_from(1 - big_y)))

    def log_cdf(self, x: float) -> float:
        return self.log_sf(-math.floor(x))


class CappedSumLaw:
    """N = W + min(V, D), W ~ DL(s_w), V ~ DL(s_v), D real (ThresholdMonitor's w_i + v̄_i)."""

    def __init__(self, scale_w: float, scale_v: float, cap: float):
        self.w = DiscreteLaplaceLaw(scale_w)
        self.v = DiscreteLaplaceLaw(scale_v)
        if not math.isfinite(cap):
            raise ValueError("cap must be finite")
        self.cap = float(cap)
        self._m = math.ceil(self.cap) - 1  # largest integer strictly below the cap
        self._log_atom = self.v.log_sf(math.ceil(self.cap))  # P(V ≥ D) = P(V̄ = D)
        self._sf_cache: dict[tuple[float, int], Interval] = {}

    def sf_interval(self, y, digits: int) -> Interval:
        """P(W + V̄ ≥ y) as a rigorous interval; the decomposition of :meth:`log_sf` evaluated in
        interval arithmetic. With Y = ⌈y⌉, M = ⌈D⌉ − 1, b = min(M, Y − 1), c = (1−ρ_v)/(1+ρ_v):
        Σ_{v ≤ b} c·ρ_v^{|v|}·ρ_w^{Y−v}/(1+ρ_w)  [v ≤ −1: a geometric series in ρ_vρ_w; 0 ≤ v ≤ b:
        one in ρ_v/ρ_w] + Σ_{v=Y}^{M} c·ρ_v^{|v|}·(1 − ρ_w^{1−Y+v}/(1+ρ_w)) + P(V ≥ M+1)·P(W ≥ y − D)."""
        key = (float(y), digits)
        if key in self._sf_cache:
            return self._sf_cache[key]
        w_inv, v_inv = (
            Interval.of(self.w._inv_scale, digits),
            Interval.of(self.v._inv_scale, digits),
        )
        rho_w, rho_v = (-w_inv).exp(), (-v_inv).exp()
        c = (1 - rho_v) / (1 + rho_v)
        big_y, m = math.ceil(Fraction(y)), self._m
        b = min(m, big_y - 1)
        rw_y = (-(w_inv * big_y)).exp()
        u0 = max(1, -b)
        part = rw_y * (-((v_inv + w_inv) * u0)).exp() / (1 - rho_v * rho_w)  # v ≤ min(b, −1)
        if b >= 0:
            ratio = w_inv - v_inv  # ln(ρ_v/ρ_w)
            if ratio.lo > 0 or ratio.hi < 0:
                geo = ((ratio * (b + 1)).exp() - 1) / (ratio.exp() - 1)
            else:
                geo = sum(((ratio * j).exp() for j in range(b + 1)), Interval.of(0, digits))
            part = part + rw_y * geo
        total = part * c / (1 + rho_w)
        if big_y <= m:
            for v in range(big_y, m + 1):
                w_tail = 1 - (-(w_inv * (1 - big_y + v))).exp() / (1 + rho_w)
                total = total + c * (-(v_inv * abs(v))).exp() * w_tail
        total = total + self.v.sf_interval(m + 1, digits) * self.w.sf_interval(
            Fraction(y) - Fraction(self.cap), digits
        )
        if len(self._sf_cache) > 256:
            self._sf_cache.clear()
        self._sf_cache[key] = total.clamp01()
        return self._sf_cache[key]

    def log_sf(self, y: float) -> float:
        """ln P(W + V̄ ≥ y).

        With Y = ⌈y⌉ and M = ⌈D⌉ − 1: Σ_{v ≤ M} P(V=v)·P(W ≥ Y − v) + P(V ≥ D)·P(W ≥ y − D). For
        v ≤ Y − 1, P(W ≥ Y − v) = ρ_w^{Y−v}/(1+ρ_w), a geometric series in v; for Y ≤ v ≤ M it is
        1 − ρ_w^{1−Y+v}/(1+ρ_w) (only reached when y is below the cap, where nothing is tiny).
        """
        w, v = self.w, self.v
        big_y = math.ceil(y)
        m = self._m
        lw1 = w._log1p_rho
        log_a = big_y * w.log_rho - lw1 + v.log_pmf_sum(-math.inf, min(m, big_y - 1), -w.log_rho)
        log_atom = self._log_atom + w.log_sf(y - self.cap)
        total = _log_add(log_a, log_atom)
        if big_y <= m:
            mass = math.exp(v.log_pmf_sum(big_y, m, 0.0))
            sub = math.exp((1 - big_y) * w.log_rho - lw1 + v.log_pmf_sum(big_y, m, w.log_rho))
            total = math.log(math.exp(total) + max(0.0, mass - sub))
        return total

    def log_cdf(self, x: float) -> float:
        """ln P(W + V̄ ≤ x): Σ_{v ≤ M} P(V=v)·P(W ≥ v − X) + P(V ≥ D)·P(W ≤ x − D), X = ⌊x⌋."""
        w, v = self.w, self.v
        big_x = math.floor(x)
        m = self._m
        lw1 = w._log1p_rho
        # v ≥ X + 1: P(W ≥ v − X) = ρ_w^{v−X}/(1+ρ_w)
        log_c = (
            -big_x * w.log_rho - lw1 + v.log_pmf_sum(big_x + 1, m, w.log_rho)
            if big_x + 1 <= m
            else _NEG_INF
        )
        log_atom = self._log_atom + w.log_cdf(x - self.cap)
        total = _log_add(log_c, log_atom)
        hi = min(big_x, m)
        # v ≤ min(X, M): P(W ≥ v − X) = 1 − ρ_w^{1+X−v}/(1+ρ_w)
        mass = math.exp(v.log_pmf_sum(-math.inf, hi, 0.0))
        sub = math.exp((1 + big_x) * w.log_rho - lw1 + v.log_pmf_sum(-math.inf, hi, -w.log_rho))
        extra = max(0.0, mass - sub)
        if extra > 0.0:
            total = math.log(math.exp(total) + extra) if total != _NEG_INF else math.log(extra)
        return total


def upper_quantile(law, log_p: float, start: int = 0) -> int:
    """Smallest integer u ≥ start with P(N ≥ u) ≤ e^{log_p} (galloping then bisection)."""
    if law.log_sf(start) <= log_p:
        return start
    lo, step = start, 1
    while law.log_sf(lo + step) > log_p:
        lo += step
        step *= 2
    hi = lo + step  # log_sf(hi) ≤ log_p < log_sf(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if law.log_sf(mid) <= log_p:
            hi = mid
        else:
            lo = mid
    return hi


def lower_quantile(law, log_p: float) -> int:
    """Smallest integer l ≥ 0 with P(N ≤ −l) ≤ e^{log_p}."""
    if law.log_cdf(0) <= log_p:
        return 0
    lo, step = 0, 1
    while law.log_cdf(-(lo + step)) > log_p:
        lo += step
        step *= 2
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if law.log_cdf(-mid) <= log_p:
            hi = mid
        else:
            lo = mid
    return hi


def _gauss_sum(c: Interval, start: int, digits: int) -> Interval:
    """Σ_{x ≥ start} e^{−c·x²} for an integer start ≥ 0 and c > 0, as an interval.

    Terms by the recurrence t_{x+1} = t_x·r_x, r_x = e^{−c(2x+1)}, r_{x+1} = r_x·e^{−2c}; the sum
    stops once a term is below 10^−digits of the partial sum, and the rest, whose ratios only
    decrease, is at most t/(1 − r) (a geometric series)."""
    term = (-(c * (start * start))).exp()
    ratio = (-(c * (2 * start + 1))).exp()
    step = (-(c * 2)).exp()
    total = Interval.of(0, digits)
    while True:
        total = total + term
        term = term * ratio
        ratio = ratio * step
        if term.hi <= total.lo.scaleb(-digits, _ctx(digits, ROUND_FLOOR)):  # 10^−digits of the sum
            break
    rest = term / (1 - ratio)
    return Interval(total.lo, (total + rest).hi, digits)


# ------------------------------------------------------------------------------------------------
# Draws from a RandomSource (same code on the secure and the seeded path), all exact
# ------------------------------------------------------------------------------------------------


def binomial_draw(source: RandomSource, n: int, p: ProbabilityFn) -> int:
    """K ~ Binomial(n, p) exactly, p given as intervals at any precision (e.g. a law's
    ``lambda d: law.sf_interval(t, d)``); see :func:`pipeline.privacy.exact.binomial_exact`."""
    return binomial_exact(source, n, p)


def geometric_draw(source: RandomSource, p: ProbabilityFn, limit: int | None = None) -> int:
    """G = number of failures before the first success, success probability p, exactly:
    P(G ≥ g) = (1−p)^g. Returns ``limit`` when G ≥ limit (p = 0 needs a limit)."""
    return geometric_exact(source, lambda d: 1 - p(d), limit)


def choose_absent_ids(
    source: RandomSource, domain_size: int, support: np.ndarray, count: int
) -> np.ndarray:
    """A uniformly random ``count``-subset of [0, domain_size) \\ support (support sorted, unique).

    Rejection from the id space: draw uniform ids in order, keep an id if it is neither in the
    support nor already kept — the sequential rejection sampler of a uniform subset (every ordered
    sequence of distinct absent ids is equally likely). Batched: a batch is processed in draw order
    (first occurrences), which is the same sequential process. When the absent set is not much
    larger than ``count`` the complement is enumerated and ``count`` ids are taken by a partial
    Fisher–Yates shuffle. Both use exactly uniform integers (:meth:`RandomSource.integers`), so the
    subset is exactly uniform.
    """
    count = int(count)
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    support = np.asarray(support, dtype=np.int64)
    absent = domain_size - support.size
    if count > absent:
        raise ValueError("count exceeds the number of absent ids")
    if absent <= 4 * count + 64 and domain_size <= (1 << 26):
        mask = np.ones(domain_size, dtype=bool)
        mask[support] = False
        pool = np.flatnonzero(mask)
        # position i swaps with a uniform position in [i, |pool|): the first `count` are a uniform subset
        swaps = np.arange(count, dtype=np.int64) + source.integers(
            pool.size - np.arange(count, dtype=np.int64)
        )
        for i, j in enumerate(swaps.tolist()):
            pool[i], pool[j] = pool[j], pool[i]
        return np.sort(pool[:count]).astype(np.int64)
    chosen: list[np.ndarray] = []
    got = np.zeros(0, dtype=np.int64)
    while got.size < count:
        need = count - got.size
        frac_absent = absent / domain_size
        batch = int(need / frac_absent * 1.2) + 16
        cand = source.integers(domain_size, batch)
        if support.size:
            pos = np.searchsorted(support, cand)
            pos = np.minimum(pos, support.size - 1)
            cand = cand[support[pos] != cand]
        # first occurrences, in draw order
        _, first = np.unique(cand, return_index=True)
        cand = cand[np.sort(first)]
        if got.size:
            cand = cand[~np.isin(cand, got)]
        cand = cand[:need]
        chosen.append(cand)
        got = np.concatenate([got, cand])
    return np.sort(got).astype(np.int64)
