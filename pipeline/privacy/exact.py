"""Exact draws for the zero-count shortcut: interval arithmetic plus a lazily refined uniform.

The sparse heavy-hitter step never touches the elements nobody holds: it draws how many of them
cross the threshold (Binomial), which ones (a uniform subset), and, for individual-charging SVT,
their published noisy values (a geometric tail); restarted AboveThreshold draws the gap to the
next crossing (geometric). Their success probabilities are tails of the discrete Laplace/Gaussian
laws, irrational numbers. Inverting a cumulative distribution function computed in floating point
gives a law that is only near the intended one; here every draw is exact:

* a probability is known as an :class:`Interval` [lo, hi] computed with directed rounding
  (``decimal`` with ROUND_FLOOR / ROUND_CEILING for +, −, ×, ÷; exp, ln and sqrt are correctly
  rounded, so one step outward bounds them), at any requested precision;
* the uniform U is a :class:`LazyUniform`: its first 64 random bits, extended by 64 more whenever
  a comparison is undecided;
* a draw K = min{k : U < F(k)} compares U with intervals around F(k); when U's known bits and the
  interval overlap, both are refined (more bits, twice the digits) until the comparison is decided.

The comparison outcome is then the exact one for the real-valued U, so K has exactly the intended
law (Devroye, *Non-Uniform Random Variate Generation*, 1986, §II.2: inversion with an exact
comparison oracle). Refinement happens with probability about the interval width (~10^-30 at the
start), so the expected cost is that of a few decimal operations per draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction

from pipeline.privacy.rng import RandomSource

__all__ = [
    "Interval",
    "LazyUniform",
    "ProbabilityFn",
    "exact_probability",
    "inverse_search",
    "binomial_exact",
    "geometric_exact",
    "START_DIGITS",
]

START_DIGITS = 34  # decimal digits of the first evaluation; doubled on each refinement
_CTX: dict[tuple[int, str], Context] = {}

# π to 200 digits (for the discrete Gaussian's normaliser by Poisson summation); the interval
# [_PI, _PI + 10^-199] contains π.
_PI = Decimal(
    "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803"
    "4825342117067982148086513282306647093844609550582231725359408128481117450284102701938521"
    "10555964462294895493038196"
)
PI_DIGITS = 199


def _ctx(digits: int, rounding: str) -> Context:
    key = (digits, rounding)
    ctx = _CTX.get(key)
    if ctx is None:
        ctx = _CTX[key] = Context(prec=digits, rounding=rounding, Emin=-(10**9), Emax=10**9)
    return ctx


class Interval:
    """A closed interval [lo, hi] of reals with Decimal ends, computed at ``digits`` significant
    digits; every operation returns an interval containing every result of the operation on
    points of its arguments."""

    __slots__ = ("lo", "hi", "digits")

    def __init__(self, lo: Decimal, hi: Decimal, digits: int):
        if lo > hi:
            raise ValueError(f"empty interval [{lo}, {hi}]")
        self.lo, self.hi, self.digits = lo, hi, digits

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def of(cls, value: int | float | Fraction, digits: int) -> Interval:
        """The tightest interval at ``digits`` around an exact rational (floats are exact binary rationals)."""
        frac = Fraction(value)
        num, den = Decimal(frac.numerator), Decimal(frac.denominator)
        return cls(
            _ctx(digits, ROUND_FLOOR).divide(num, den),
            _ctx(digits, ROUND_CEILING).divide(num, den),
            digits,
        )

    def _mk(self, other: Interval | int | Fraction) -> Interval:
        return other if isinstance(other, Interval) else Interval.of(other, self.digits)

    # -- arithmetic ----------------------------------------------------------------------------------
    def __add__(self, other) -> Interval:
        o = self._mk(other)
        d = max(self.digits, o.digits)
        return Interval(
            _ctx(d, ROUND_FLOOR).add(self.lo, o.lo), _ctx(d, ROUND_CEILING).add(self.hi, o.hi), d
        )

    __radd__ = __add__

    def __neg__(self) -> Interval:
        # copy_negate is exact; unary minus would round to the default context's 28 digits
        return Interval(self.hi.copy_negate(), self.lo.copy_negate(), self.digits)

    def __sub__(self, other) -> Interval:
        return self + (-self._mk(other))

    def __rsub__(self, other) -> Interval:
        return self._mk(other) + (-self)

    def __mul__(self, other) -> Interval:
        o = self._mk(other)
        d = max(self.digits, o.digits)
        dn, up = _ctx(d, ROUND_FLOOR), _ctx(d, ROUND_CEILING)
        pairs = [(self.lo, o.lo), (self.lo, o.hi), (self.hi, o.lo), (self.hi, o.hi)]
        return Interval(
            min(dn.multiply(a, b) for a, b in pairs), max(up.multiply(a, b) for a, b in pairs), d
        )

    __rmul__ = __mul__

    def __truediv__(self, other) -> Interval:
        o = self._mk(other)
        if o.lo <= 0 <= o.hi:
            raise ZeroDivisionError("divisor interval contains 0")
        d = max(self.digits, o.digits)
        dn, up = _ctx(d, ROUND_FLOOR), _ctx(d, ROUND_CEILING)
        pairs = [(self.lo, o.lo), (self.lo, o.hi), (self.hi, o.lo), (self.hi, o.hi)]
        return Interval(
            min(dn.divide(a, b) for a, b in pairs), max(up.divide(a, b) for a, b in pairs), d
        )

    def __rtruediv__(self, other) -> Interval:
        return self._mk(other) / self

    # -- monotone functions (correctly rounded in decimal, widened by one unit in the last place) ----
    def _monotone(self, name: str) -> Interval:
        ctx = _ctx(
            self.digits + 2, ROUND_FLOOR
        )  # rounding mode irrelevant: exp/ln/sqrt round half-even
        lo, hi = getattr(ctx, name)(self.lo), getattr(ctx, name)(self.hi)
        return Interval(ctx.next_minus(lo), ctx.next_plus(hi), self.digits)

    def exp(self) -> Interval:
        return self._monotone("exp")

    def ln(self) -> Interval:
        if self.lo <= 0:
            raise ValueError("ln of an interval reaching 0")
        return self._monotone("ln")

    def sqrt(self) -> Interval:
        if self.lo < 0:
            raise ValueError("sqrt of an interval reaching below 0")
        return self._monotone("sqrt")

    def clamp01(self) -> Interval:
        """Intersect with [0, 1] (for a quantity known to be a probability)."""
        return Interval(max(self.lo, Decimal(0)), min(self.hi, Decimal(1)), self.digits)

    def __repr__(self) -> str:
        return f"Interval[{self.lo}, {self.hi}]"


def pi_interval(digits: int) -> Interval:
    if digits > PI_DIGITS - 5:
        raise ValueError(f"π is stored to {PI_DIGITS} digits")
    up = _ctx(PI_DIGITS + 5, ROUND_CEILING)
    return Interval(_PI, up.add(_PI, up.power(Decimal(10), -PI_DIGITS)), digits)


ProbabilityFn = Callable[[int], Interval]  # digits -> an interval containing the probability


def exact_probability(p: Fraction | float) -> ProbabilityFn:
    """A ProbabilityFn for a rational probability (tests, and probabilities known exactly)."""
    return lambda digits: Interval.of(p, digits)


class LazyUniform:
    """U uniform on (0, 1), known through its first ``bits`` binary digits (U ∈ [u/2^b, (u+1)/2^b)),
    extended from the random source on demand."""

    def __init__(self, source: RandomSource):
        self.source = source
        self.u = int(source.words(1)[0])
        self.bits = 64

    def refine(self) -> None:
        self.u = (self.u << 64) | int(self.source.words(1)[0])
        self.bits += 64

    def as_float(self) -> float:
        """A float near U (for first guesses only)."""
        return float(Fraction(2 * self.u + 1, 1 << (self.bits + 1)))

    def below(self, x: Interval) -> bool | None:
        """Whether U < x: True/False when decided by the known bits and the interval, None if not."""
        # exact products: the context holds every digit of x·2^b
        width = max(len(x.lo.as_tuple().digits), len(x.hi.as_tuple().digits))
        ctx = _ctx(
            -(-(width + self.bits) // 32) * 32, ROUND_FLOOR
        )  # a multiple of 32: few cached contexts
        scale = Decimal(1 << self.bits)
        if ctx.multiply(x.lo, scale) >= self.u + 1:  # U < (u+1)/2^b ≤ lo ≤ x
            return True
        if ctx.multiply(x.hi, scale) <= self.u:  # x ≤ hi ≤ u/2^b ≤ U (U = u/2^b has probability 0)
            return False
        return None


def _decide(u: LazyUniform, value: Callable[[int], Interval], digits: int) -> tuple[bool, int]:
    """Whether U < value, refining U and the precision until decided; returns (answer, digits used)."""
    while True:
        answer = u.below(value(digits))
        if answer is not None:
            return answer, digits
        u.refine()
        digits *= 2


def inverse_search(
    u: LazyUniform,
    cdf: Callable[[int, int], Interval],
    guess: int,
    digits: int = START_DIGITS,
    upper: int | None = None,
) -> int:
    """min{k ≥ 0 : U < F(k)} for a non-decreasing F given as intervals ``cdf(k, digits)``, by
    galloping from ``guess``; ``upper`` (optional) is a k with F(k) = 1, returned if reached."""

    def hit(k: int) -> bool:
        nonlocal digits
        if upper is not None and k >= upper:
            return True
        ans, digits = _decide(u, lambda d: cdf(k, d), digits)
        return ans

    k = max(0, int(guess))
    if upper is not None:
        k = min(k, upper)
    if hit(k):  # the answer is ≤ k: gallop down to a miss
        hi, step = k, 1
        while True:
            if hi == 0:
                return 0
            cand = max(0, hi - step)
            if not hit(cand):
                lo = cand
                break
            hi, step = cand, step * 2
    else:  # the answer is > k: gallop up to a hit
        lo, step = k, 1
        while True:
            cand = lo + step if upper is None else min(lo + step, upper)
            if hit(cand):
                hi = cand
                break
            lo, step = cand, step * 2
    while hi - lo > 1:  # not hit(lo), hit(hi)
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid
    return hi


def binomial_exact(source: RandomSource, n: int, p: ProbabilityFn) -> int:
    """K ~ Binomial(n, p), exactly: K = min{k : U < P(Bin ≤ k)}.

    The cumulative probabilities are summed upwards from pmf(0) = (1−p)^n with
    pmf(j+1) = pmf(j)·(n−j)/(j+1)·p/(1−p), all in interval arithmetic, so the work is O(K) decimal
    operations (K is tiny in the heavy-hitter use: n·p ≤ β/(2·horizon) by the threshold's choice).
    """
    n = int(n)
    if n <= 0:
        return 0
    u = LazyUniform(source)
    digits = START_DIGITS
    while True:  # one pass at a precision; a pass that meets an undecided comparison restarts finer
        prob = p(digits).clamp01()
        if prob.hi == 0:
            return 0
        if prob.lo == 1:
            return n
        q = 1 - prob
        if q.lo <= 0:  # p's interval reaches 1 at this precision: go finer
            u.refine()
            digits *= 2
            continue
        pmf = (q.ln() * n).exp()
        ratio = prob / q
        cdf = pmf
        k = 0
        while True:
            if k >= n:
                return n
            answer = u.below(cdf.clamp01())
            if answer is None:
                break
            if answer:
                return k
            pmf = pmf * ratio * Fraction(n - k, k + 1)
            cdf = cdf + pmf
            k += 1
        u.refine()
        digits *= 2


def geometric_exact(source: RandomSource, q: ProbabilityFn, limit: int | None = None) -> int:
    """G ~ Geometric with P(G ≥ g) = q^g (failures before the first success, success probability
    1 − q), exactly: G = min{g : U < 1 − q^{g+1}}. ``limit``: return ``limit`` when G ≥ limit (the
    caller only needs to know that much); q = 1 returns ``limit`` (or raises without one)."""
    u = LazyUniform(source)
    q0 = q(START_DIGITS).clamp01()
    if q0.lo == 1:
        if limit is None:
            raise ValueError("q = 1: the geometric draw is infinite")
        return limit
    if q0.hi == 0:
        return 0
    # a float first guess: G ≈ ln(1 − U)/ln q (ln q from the interval: q may round to 1.0 in float)
    guess = 0
    if q0.lo > 0:
        ln_q = float(q0.ln().hi)
        if ln_q < 0:
            g = math.log1p(-u.as_float()) / ln_q
            guess = int(min(g, float(limit if limit is not None else 2**62)))
        else:
            guess = limit if limit is not None else 2**62

    def cdf(g: int, digits: int) -> Interval:
        qi = q(digits).clamp01()
        if qi.lo == 0:
            return 1 - Interval(Decimal(0), qi.hi, digits)  # crude but valid; refinement narrows it
        return 1 - (qi.ln() * (g + 1)).exp()

    return inverse_search(u, cdf, guess, upper=limit)
