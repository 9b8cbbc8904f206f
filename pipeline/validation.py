"""Argument checks shared by the mechanisms: every error names the offending argument."""

from __future__ import annotations

import math
import numbers
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["check_int", "check_real", "StrictModel"]


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer (not a bool) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if low is not None and v < low:
        raise ValueError(f"{name} must be >= {low}, got {v}")
    if high is not None and v > high:
        raise ValueError(f"{name} must be <= {high}, got {v}")
    return v


def check_real(value: Any, name: str, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number (not a bool) within the given, optionally open, bounds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (v > high or (high_open and v == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value!r}")
    return v


class StrictModel(BaseModel):
    """Base of the configuration models: unknown keys are refused, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
