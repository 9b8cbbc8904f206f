"""Exact discrete Gaussian and discrete Laplace samplers, vectorised over numpy arrays.

Algorithms (Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", 2020):

* Algorithm 1 — Bernoulli(exp(−γ)) for rational γ. For γ ∈ [0, 1]: draw A_k ~ Bernoulli(γ/k) for
  k = 1, 2, ... until the first A_K = 0 and return 1 iff K is odd. For γ > 1: ⌊γ⌋ independent
  Bernoulli(exp(−1)) trials, then one Bernoulli(exp(−(γ − ⌊γ⌋))); return 1 iff all succeed.
* Algorithm 2 — discrete Laplace, pmf ∝ exp(−|x|·s/t) for integers s, t ≥ 1: U uniform in
  {0..t−1}, keep it with probability exp(−U/t); V = number of Bernoulli(exp(−1)) successes before
  the first failure; X = U + t·V; Y = ⌊X/s⌋; a fair sign bit B; reject (B = 1, Y = 0); return ±Y.
* Algorithm 3 — discrete Gaussian N_Z(0, σ²): t = ⌊σ⌋ + 1; Y from discrete Laplace with scale t;
  accept Y with probability exp(−(|Y| − σ²/t)² / (2σ²)) (Algorithm 1); otherwise retry.

Vectorisation. Every stage runs on all pending lanes at once with numpy masks; a lane's random
choices are independent of every other lane's, so a lane behaves exactly as the sequential
algorithm. Rejection loops are run as "draw a batch of independent attempts, keep the accepted
ones in order, top up until ``size`` are collected": accepted attempts of a rejection sampler are
i.i.d. from the target, and a stopping rule that only counts them does not bias them.

Why exactness holds. The only randomness consumed is uniform words from the source. Every
Bernoulli(p) with rational p (p = γ/k in Algorithm 1) is decided by comparing a 16-bit uniform u,
i.e. a uniform U ∈ [u/2¹⁶, (u+1)/2¹⁶) whose lower bits are not drawn yet, with p: if the whole cell
lies below p the answer is 1, if it lies at or above p it is 0. To decide this quickly p is
enclosed in floats, lo ≤ p·2¹⁶ ≤ hi, using only IEEE-754 operations with bounded, correctly
rounded error (no exp/log from libm) and a wide safety margin. When the cell straddles the
enclosure (probability about 2⁻¹⁵ per draw) that lane is settled exactly in Python integers and
Fractions by continuing the comparison of U with p on fresh words. So every decision equals
[U < p] for a uniform U: the Bernoulli draws, and hence the samplers, have exactly the
distributions of the paper's algorithms. Two further exact identities are used: when a float
enclosure of γ straddles an integer (e.g. γ is an integer), ⌊γ⌋ is taken one lower and the
remainder r ∈ [0, 2) is handled as exp(−r) = exp(−r/2)², two runs of the γ ≤ 1 case; and
Algorithm 2's draws for attempts later rejected are simply dropped. Integer arithmetic is int64
with explicit bounds checks (parameter limits below, and an ``OverflowError`` if X = U + t·V could
leave int64 — that needs V > 2**11, probability below exp(−2048)).

Parameters and rounding. The parameter used is exposed by :func:`exact_sigma2` /
:func:`exact_scale`. Floats are dyadic rationals and are used exactly; ints and
``fractions.Fraction`` are exact input. The discrete Gaussian uses σ² exactly as given (its large
rationals only appear in the rare exact resolution path). The discrete Laplace needs t and s in
int64 arithmetic: if the scale t/s has a numerator or denominator above 2**52 it is rounded UP
(more noise, still private) to ⌈scale·2^k⌉/2^k with the largest k keeping the numerator ≤ 2**52;
the relative increase is below 2**-32 over the accepted range. Limits: 2**-100 ≤ σ² ≤ 2**80 and
2**-20 ≤ scale ≤ 2**50.

Randomness. ``rng`` is resolved by :func:`pipeline.privacy.rng.as_random_source`: ``None`` is the
operating system CSPRNG (the production default), an ``int`` is a seeded PCG64 source for
simulation and tests only (not secure), and a ``RandomSource`` is used as is (it advances).
Both paths run the same code.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from .rng import RandomSource, as_random_source

__all__ = ["discrete_gaussian", "discrete_laplace", "exact_sigma2", "exact_scale", "used_scale"]

# Bits of the uniform compared with p in each Bernoulli(p) of Algorithm 1: a draw needs the
# exact path with probability about 2**-(_UBITS-1) (≤ 16; tests lower it to exercise that path).
_UBITS = 16
# 16-bit units requested from the source at a time.
_BLOCK = 1 << 16
_INT64_MAX = (1 << 63) - 1

# Parameter ranges (see module docstring).
_SIGMA2_MIN = Fraction(1, 1 << 100)
_SIGMA2_MAX = Fraction(1 << 80)
_SCALE_MIN = Fraction(1, 1 << 20)
_SCALE_MAX = Fraction(1 << 50)
_LAPLACE_INT_BITS = 52  # numerator and denominator of the Laplace scale stay ≤ 2**52

# Relative widening of float enclosures. Each enclosure is built from at most a handful of
# correctly rounded operations (relative error ≤ 2**-53 each), so 2**-48 leaves > 8x slack.
_REL_SLACK = 2.0**-48

# Attempts per vectorised pass: large enough to amortise numpy call overhead, small enough that
# the working arrays stay in cache.
_CHUNK = 1 << 16
# Passes of Algorithm 1 run over all lanes before switching to compacted lanes.
_DENSE_PASSES = 2


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------
def _as_fraction(value, name: str) -> Fraction:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a finite positive number, got bool {value!r}")
    if isinstance(value, Fraction):
        frac = value
    elif isinstance(value, numbers.Integral):
        frac = Fraction(int(value))
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be a finite positive number, got {value!r}")
        frac = Fraction(float(value))
    else:
        raise TypeError(
            f"{name} must be a finite positive number (int, float or Fraction), got {type(value).__name__}"
        )
    if frac <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return frac


def exact_sigma2(sigma2) -> Fraction:
    """The exact σ² used by :func:`discrete_gaussian` (the input itself, as a Fraction)."""
    frac = _as_fraction(sigma2, "sigma2")
    if not _SIGMA2_MIN <= frac <= _SIGMA2_MAX:
        raise ValueError(f"sigma2 must be between 2**-100 and 2**80, got {sigma2!r}")
    return frac


def exact_scale(scale) -> Fraction:
    """The exact scale used by :func:`discrete_laplace`: the input, or the input rounded up to
    ⌈scale·2^k⌉/2^k (relative increase < 2**-32) when its numerator or denominator exceeds 2**52."""
    frac = _as_fraction(scale, "scale")
    if not _SCALE_MIN <= frac <= _SCALE_MAX:
        raise ValueError(f"scale must be between 2**-20 and 2**50, got {scale!r}")
    limit = 1 << _LAPLACE_INT_BITS
    if frac.numerator <= limit and frac.denominator <= limit:
        return frac
    ceil_bits = math.ceil(frac).bit_length()
    k = _LAPLACE_INT_BITS - ceil_bits  # ≥ 2 because scale ≤ 2**50
    return Fraction(-((-frac.numerator << k) // frac.denominator), 1 << k)


def used_scale(scale) -> float:
    """:func:`exact_scale` as a float: the scale the discrete Laplace sampler actually uses."""
    return float(exact_scale(scale))


def _check_size(size) -> int:
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, numbers.Integral):
        raise TypeError(f"size must be a non-negative int, got {type(size).__name__}")
    size = int(size)
    if size < 0:
        raise ValueError(f"size must be a non-negative int, got {size}")
    return size


# --------------------------------------------------------------------------------------------
# random words
# --------------------------------------------------------------------------------------------
class _Pool:
    """Hands out 16-bit uniforms cut from the source's 64-bit words. Words are requested in blocks
    (few system calls on the secure source) and every unit is used at most once; what is left
    when the sampler returns is dropped."""

    __slots__ = ("src", "_buf", "_pos")

    def __init__(self, src: RandomSource):
        self.src = src
        self._buf = np.zeros(0, dtype=np.uint16)
        self._pos = 0

    def u16(self, n: int) -> np.ndarray:
        avail = self._buf.size - self._pos
        if n > avail:
            fresh = self.src.words((max(n - avail, _BLOCK) + 3) // 4).view(np.uint16)
            self._buf = np.concatenate((self._buf[self._pos :], fresh)) if avail else fresh
            self._pos = 0
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def u32(self, n: int) -> np.ndarray:
        pair = self.u16(2 * n).astype(np.uint32)
        return (pair[0::2] << np.uint32(16)) | pair[1::2]

    def cells(self, n: int) -> np.ndarray:
        """n uniform integers in [0, 2**_UBITS) as float64 (exact)."""
        u = self.u16(n)
        if _UBITS != 16:
            u = u >> np.uint16(16 - _UBITS)
        return u.astype(np.float64)

    def bits(self, n: int) -> np.ndarray:
        """n fair bits as a bool array."""
        raw = self.u16((n + 15) // 16)
        return np.unpackbits(raw.view(np.uint8), count=n).view(np.bool_)


def _exact_bernoulli(src: RandomSource, p: Fraction) -> bool:
    """Exact Bernoulli(p) for a rational p, by comparing a uniform with p 64 bits at a time."""
    while True:
        if p <= 0:
            return False
        if p >= 1:
            return True
        v = p * (1 << 64)
        fl = v.numerator // v.denominator
        w = int(src.words(1)[0])
        if w != fl:
            return w < fl
        p = v - fl


def _resolve(src: RandomSource, p: Fraction, u: int) -> bool:
    """[U < p] for U uniform in the cell [u, u+1)/2**_UBITS: continue the comparison on fresh words."""
    return _exact_bernoulli(src, p * (1 << _UBITS) - u)


# --------------------------------------------------------------------------------------------
# Algorithm 1: Bernoulli(exp(-gamma))
# --------------------------------------------------------------------------------------------
def _bern_exp_unit(
    pool: _Pool, lo, hi, exact_gamma: Callable[[int], Fraction], n: int, k0: int = 1
) -> np.ndarray:
    """Bernoulli(exp(−γ_i)) for γ_i ∈ [0, 1], one per lane (Algorithm 1, first part).

    ``lo``/``hi`` (arrays of length n, or scalars) enclose γ_i·2**_UBITS; ``exact_gamma(i)`` gives
    the exact γ_i, used only to resolve a draw whose cell straddles the enclosure. ``k0 = 2`` may be
    passed when every γ_i = 1 (A_1 ~ Bernoulli(1) is then certain).

    The first passes run densely over all lanes (cheap elementwise ops, no compaction); the few
    lanes still going after that continue on compacted index arrays.
    """
    res = np.zeros(n, dtype=np.bool_)
    alive = np.ones(n, dtype=np.bool_)
    k = k0 - 1
    for k in range(k0, k0 + _DENSE_PASSES):
        succ = _bernoulli_pass(pool, lo, hi, k, n, alive, exact_gamma, None)
        stop = alive & ~succ
        if k % 2 == 1:  # lanes whose first failure is at an odd k return 1
            res |= stop
        alive &= succ
    idx = np.flatnonzero(alive)
    if np.ndim(lo) > 0:
        lo, hi = lo[idx], hi[idx]
    while idx.size:
        k += 1
        succ = _bernoulli_pass(pool, lo, hi, k, idx.size, None, exact_gamma, idx)
        if k % 2 == 1:
            res[idx[~succ]] = True
        idx = idx[succ]
        if np.ndim(lo) > 0:
            lo, hi = lo[succ], hi[succ]
    return res


def _bernoulli_pass(pool, lo, hi, k, m, alive, exact_gamma, idx) -> np.ndarray:
    """A_k ~ Bernoulli(γ/k) for m lanes given the enclosure lo ≤ γ·2**_UBITS ≤ hi.

    U·2**_UBITS ∈ [u, u+1): A_k = [U < γ/k] is certain when (u+1)·k ≤ lo and impossible when
    u·k ≥ hi (u·k is exact: u < 2**16, k < 2**30). Otherwise the cell straddles and the lane is
    settled exactly. Lanes outside ``alive`` (dense passes) are computed but ignored by the caller.
    """
    u = pool.cells(m)
    uk = u * k
    succ = (uk + k) <= lo
    fail = uk >= hi
    if np.count_nonzero(succ) + np.count_nonzero(fail) != m:
        open_ = ~(succ | fail)
        if alive is not None:
            open_ &= alive
        for j in np.flatnonzero(open_):
            lane = int(j) if idx is None else int(idx[j])
            succ[j] = _resolve(pool.src, exact_gamma(lane) / k, int(u[j]))
    return succ


def _bern_exp_minus_one(pool: _Pool, n: int) -> np.ndarray:
    """n independent Bernoulli(exp(−1)) draws (Algorithm 1 with γ = 1)."""
    cells = float(1 << _UBITS)
    return _bern_exp_unit(pool, cells, cells, lambda i: Fraction(1), n, k0=2)


def _geometric_e1(pool: _Pool, n: int) -> np.ndarray:
    """Number of Bernoulli(exp(−1)) successes before the first failure, per lane."""
    v = np.zeros(n, dtype=np.int64)
    alive = np.arange(n)
    while alive.size:
        alive = alive[_bern_exp_minus_one(pool, alive.size)]
        v[alive] += 1
    return v


def _exact_bern_exp_unit(src: RandomSource, gamma: Fraction) -> bool:
    """Algorithm 1 for γ ∈ [0, 1] in exact rational arithmetic."""
    k = 1
    while _exact_bernoulli(src, gamma / k):
        k += 1
    return k % 2 == 1


def _exact_bern_exp(src: RandomSource, gamma: Fraction) -> bool:
    """Algorithm 1 for any rational γ ≥ 0 in exact arithmetic, for the rare lanes the float path
    cannot settle."""
    whole = gamma.numerator // gamma.denominator
    for _ in range(whole):  # each trial fails w.p. 1 − 1/e, so this ends fast whatever ⌊γ⌋ is
        if not _exact_bern_exp_unit(src, Fraction(1)):
            return False
    return _exact_bern_exp_unit(src, gamma - whole)


# --------------------------------------------------------------------------------------------
# Algorithm 2: discrete Laplace
# --------------------------------------------------------------------------------------------
def _uniform_below(pool: _Pool, t: int, m: int) -> np.ndarray:
    """Uniform integers in [0, t) from about m attempts (rejected attempts are dropped, so fewer
    than m values may come back; the survivors are i.i.d. uniform)."""
    if t == 1:
        return np.zeros(m, dtype=np.int64)
    for bits, draw, dtype in ((16, pool.u16, np.uint16), (32, pool.u32, np.uint32)):
        if t <= 1 << bits:
            w = draw(m)
            floor = (
                1 << bits
            ) % t  # accept w ≥ 2**bits mod t: a multiple of t equally likely words
            if floor:
                w = w[w >= floor]
            return (w % dtype(t) if t < 1 << bits else w).astype(np.int64)
    return pool.src.integers(t, m)


def _laplace_attempts(pool: _Pool, t: int, s: int, m: int) -> np.ndarray:
    """Run about m attempts of Algorithm 2 (scale t/s); return the accepted samples in order."""
    u = _uniform_below(pool, t, m)
    # u, t ≤ 2**52 are exact floats: g = γ·2**_UBITS up to two roundings, inside the 2**-48 slack
    g = u.astype(np.float64) * (float(1 << _UBITS) / t)
    keep = _bern_exp_unit(
        pool,
        g * (1.0 - _REL_SLACK),
        g * (1.0 + _REL_SLACK),
        lambda i: Fraction(int(u[i]), t),
        u.size,
    )
    u = u[keep]
    v = _geometric_e1(pool, u.size)
    if v.size and int(v.max()) > (_INT64_MAX - t) // t:
        raise OverflowError(
            "discrete Laplace: U + t*V exceeds int64 (probability below exp(-2048))"
        )
    x = u + t * v
    y = x // s if s != 1 else x
    neg = pool.bits(y.size)
    ok = ~(neg & (y == 0))
    return np.where(neg, -y, y)[ok]


# --------------------------------------------------------------------------------------------
# Algorithm 3: discrete Gaussian
# --------------------------------------------------------------------------------------------
class _GaussParams:
    __slots__ = ("sigma2", "t", "c", "c_f", "inv_f")

    def __init__(self, sigma2: Fraction):
        self.sigma2 = sigma2
        self.t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1  # ⌊σ⌋ + 1 exactly
        self.c = sigma2 / self.t  # σ²/t
        self.c_f = float(self.c)  # correctly rounded
        self.inv_f = float(1 / (2 * sigma2))  # correctly rounded 1/(2σ²)

    def gamma(self, y: int) -> Fraction:
        return (abs(y) - self.c) ** 2 / (2 * self.sigma2)


def _gauss_accept(pool: _Pool, y: np.ndarray, prm: _GaussParams) -> np.ndarray:
    """Bernoulli(exp(−γ(y))) with γ(y) = (|y| − σ²/t)²/(2σ²) per lane (Algorithm 1, both parts)."""
    n = y.size
    yf = np.abs(y).astype(np.float64)
    d = yf - prm.c_f
    ad = np.abs(d)
    # |d − (|y| − c)| ≤ 2**-53·(|y| + c + |d|)(1 + tiny); 2**-49 gives ample slack.
    e_d = (yf + prm.c_f + ad) * 2.0**-49
    gam = d * d * prm.inv_f
    # γ error: relative rounding of d²·(1/2σ²) plus the propagated error of d.
    e_g = gam * _REL_SLACK + 1.01 * e_d * (2.0 * ad + e_d) * prm.inv_f + 2.0**-1000
    g_lo = gam - e_g  # ≤ γ (the slack also covers this subtraction's rounding)
    g_hi = gam + e_g  # ≥ γ
    g_lo = np.maximum(g_lo, 0.0)
    # q = ⌊g_lo⌋ ≤ γ: the integer part handled by Bernoulli(exp(−1)) trials. Usually q = ⌊γ⌋;
    # when the enclosure straddles an integer (e.g. γ exactly an integer) the remainder γ − q
    # may reach [1, 2) and is then split in two halves below.
    big = g_hi >= 2.0**44  # float error could exceed 1/4 here; such lanes go the exact way
    q_f = np.floor(np.minimum(g_lo, 2.0**44))
    q = q_f.astype(np.int64)
    # For integers 0 ≤ q ≤ x < 2**53 the difference x − q is exact in binary64 (it is a multiple of
    # ulp(x) no larger than x), so r_lo ≤ γ − q ≤ r_hi holds without rounding.
    r_lo = g_lo - q_f
    r_hi = g_hi - q_f
    one = ~big & (r_hi < 1.0)  # γ − q ∈ [0, 1): one run of Algorithm 1
    two = ~big & (r_hi >= 1.0) & (r_hi < 2.0)  # γ − q ∈ [0, 2): exp(−r) = exp(−r/2)²

    ok = np.ones(n, dtype=np.bool_)
    # q Bernoulli(exp(−1)) trials per lane, stopping a lane at its first failure.
    lanes = np.flatnonzero(q > 0)
    done = 0
    while lanes.size:
        succ = _bern_exp_minus_one(pool, lanes.size)
        ok[lanes[~succ]] = False
        done += 1
        lanes = lanes[succ]
        lanes = lanes[q[lanes] > done]

    def remainder(lanes_, halves):
        return lambda i: (prm.gamma(int(y[lanes_[i]])) - int(q[lanes_[i]])) / halves

    lanes = np.flatnonzero(ok & one)
    cells = float(1 << _UBITS)
    ok[lanes] = _bern_exp_unit(
        pool, r_lo[lanes] * cells, r_hi[lanes] * cells, remainder(lanes, 1), lanes.size
    )
    lanes = np.flatnonzero(ok & two)
    lo, hi = r_lo[lanes] * (cells / 2), r_hi[lanes] * (cells / 2)
    first = _bern_exp_unit(pool, lo, hi, remainder(lanes, 2), lanes.size)
    ok[lanes] = first & _bern_exp_unit(pool, lo, hi, remainder(lanes, 2), lanes.size)

    # Anything else (γ ≥ 2**44, vanishingly rare survivors): finish exp(−(γ − q)) exactly.
    for i in np.flatnonzero(ok & ~(one | two)):
        ok[i] = _exact_bern_exp(pool.src, prm.gamma(int(y[i])) - int(q[i]))
    return ok


def _gaussian_attempts(pool: _Pool, prm: _GaussParams, m: int) -> np.ndarray:
    y = _laplace_attempts(pool, prm.t, 1, m)
    return y[_gauss_accept(pool, y, prm)]


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------
def _collect(size: int, attempt: Callable[[int], np.ndarray], rate: float) -> np.ndarray:
    """Concatenate accepted samples from batches of attempts until ``size`` are collected."""
    out = np.empty(size, dtype=np.int64)
    have = 0
    while have < size:
        need = size - have
        m = min(_CHUNK, int(need / rate * 1.03) + 16)
        got = attempt(m)
        take = min(got.size, need)
        out[have : have + take] = got[:take]
        have += take
    return out


def discrete_laplace(scale, size: int, rng=None) -> np.ndarray:
    """``size`` i.i.d. draws with pmf ∝ exp(−|x|/scale) on the integers (int64).

    ``scale`` is an int, float or Fraction (see :func:`exact_scale` for the value actually used);
    ``rng`` is None (secure, default), an int seed (simulation only) or a RandomSource.
    """
    frac = exact_scale(scale)
    size = _check_size(size)
    src = as_random_source(rng)
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    t, s = frac.numerator, frac.denominator
    # Accepted fraction of attempts ≈ (1 − e^{-1})·(1 − P(Y = 0)/2); a guess only sizes batches.
    p0 = 1.0 - math.exp(-1.0 / float(frac))
    rate = (1.0 - math.exp(-1.0)) * (1.0 - p0 / 2.0)
    pool = _Pool(src)
    return _collect(size, lambda m: _laplace_attempts(pool, t, s, m), rate)


def discrete_gaussian(sigma2, size: int, rng=None) -> np.ndarray:
    """``size`` i.i.d. draws from the discrete Gaussian N_Z(0, σ²), pmf ∝ exp(−x²/(2σ²)) (int64).

    ``sigma2`` is an int, float or Fraction, used exactly (:func:`exact_sigma2`); ``rng`` is None
    (secure, default), an int seed (simulation only) or a RandomSource.
    """
    frac = exact_sigma2(sigma2)
    size = _check_size(size)
    src = as_random_source(rng)
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    prm = _GaussParams(frac)
    sig = math.sqrt(float(frac))
    p0 = 1.0 - math.exp(-1.0 / prm.t)
    rate = (1.0 - math.exp(-1.0)) * (1.0 - p0 / 2.0) * min(1.0, 0.6 + 0.4 * min(sig, 1.0))
    pool = _Pool(src)
    return _collect(size, lambda m: _gaussian_attempts(pool, prm, m), rate)
