"""The root of an increasing function by bisection, for the (ε, δ) conversions of
:mod:`pipeline.privacy.accounting`.

Every process that loads a configuration converts its zCDP budget to (ε, δ) while validating it
(the worker, the releaser, each `dpstream` command). Importing ``scipy.optimize`` for one root
finder cost each of them about 0.4 s of CPU; bisection needs no import and, on the brackets the
conversions use (width below 60), reaches the same tolerance in under 60 halvings.

Any point of the bracket gives a valid conversion (the (ε, δ) formulas hold for every α > 1; the
root only makes them tightest), so the tolerance matters for tightness, never for privacy.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["increasing_root"]


def increasing_root(
    f: Callable[[float], float],
    lo: float,
    hi: float,
    *,
    xtol: float,
    rtol: float,
    maxiter: int = 500,
) -> float:
    """The root of ``f``, increasing on [lo, hi] with f(lo) ≤ 0 ≤ f(hi), within
    ``xtol + rtol·|root|`` (the stopping rule of scipy.optimize.brentq).

    Args:
        f: increasing on [lo, hi].
        lo, hi: the bracket.
        xtol, rtol: absolute and relative tolerance on the root.
        maxiter: halvings before giving up.

    Returns:
        The midpoint of the last bracket.

    Raises:
        ValueError: the bracket does not hold a sign change, or is not found within ``maxiter``.
    """
    f_lo, f_hi = f(lo), f(hi)
    if f_lo > 0.0 or f_hi < 0.0:
        raise ValueError(
            f"increasing_root: f({lo}) = {f_lo} and f({hi}) = {f_hi} do not bracket a "
            "root of an increasing function"
        )
    if f_lo == 0.0:
        return lo
    if f_hi == 0.0:
        return hi
    for _ in range(maxiter):
        mid = 0.5 * (lo + hi)
        if hi - lo <= xtol + rtol * abs(mid) or mid in (lo, hi):
            return mid
        value = f(mid)
        if value == 0.0:
            return mid
        if value < 0.0:
            lo = mid
        else:
            hi = mid
    raise ValueError(f"increasing_root: no root within {maxiter} halvings")
