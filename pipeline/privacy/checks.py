"""Validation of the real-valued arguments of the privacy accounting (ρ, ε, δ, shares, factors)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_real"]


def check_real(
    value: Any,
    name: str,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """``value`` as a float in [``low``, ``high``] (``(low, high]`` if ``low_open``); TypeError or
    ValueError naming ``name`` otherwise (nan always, infinity unless ``allow_inf``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not hasattr(value, "__float__")
    ):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be nan")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {v}")
    if v < low or (low_open and v == low) or v > high:
        lo = "(" if low_open else "["
        raise ValueError(f"{name} must be in {lo}{low}, {high}], got {v}")
    return v
