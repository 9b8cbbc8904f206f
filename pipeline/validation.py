"""Argument checks shared by the mechanisms: every error names the offending argument.

Scalars (:func:`check_int`, :func:`check_real`, :func:`check_rho`, :func:`check_beta`) and the
per-step arrays the synthesizers (:func:`coerce_values`, :func:`coerce_counts`) and the monitors
(:func:`check_values`, :func:`check_contributions`) take from the curator."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

__all__ = [
    "check_int",
    "check_real",
    "check_rho",
    "check_beta",
    "coerce_values",
    "coerce_counts",
    "check_values",
    "check_contributions",
    "StrictModel",
]


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


def check_real(
    value: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
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


def check_rho(rho: Any) -> float:
    rho = check_real(rho, "rho")
    if rho <= 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    return rho


def check_beta(beta: Any) -> float:
    beta = check_real(beta, "beta")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return beta


def coerce_values(
    values: Any, categories: int, expected_len: int | None, name: str = "values"
) -> np.ndarray:
    """Validate one step of per-user reports and return them as int64.

    Accepts integer arrays, float arrays whose entries are all integral (e.g. ``1.0``), and bool
    arrays when ``categories == 2``. Raises TypeError/ValueError naming ``name`` otherwise.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D array with one value per user, got shape {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty: at least one user is needed")
    if expected_len is not None and arr.size != expected_len:
        raise ValueError(
            f"{name} has length {arr.size} but the synthesizer has n={expected_len} users "
            "(the roster is fixed by the first step)"
        )
    if arr.dtype == np.bool_:
        if categories != 2:
            raise TypeError(f"{name} is boolean but categories={categories}; pass integer codes")
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.integer):
        bad = (arr < 0) | (arr >= categories)
    elif np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or infinite entries")
        if np.any(arr != np.floor(arr)):
            i = int(np.flatnonzero(arr != np.floor(arr))[0])
            raise ValueError(f"{name} must hold integer category codes; entry {i} is {arr[i]!r}")
        bad = (arr < 0) | (arr >= categories)
    else:
        raise TypeError(
            f"{name} must be an integer (or integral float) array, got dtype {arr.dtype}"
        )
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [0, {categories}); entry {i} is {arr[i]!r}")
    return arr.astype(np.int64)


def coerce_counts(counts: Any, size: int, name: str) -> np.ndarray:
    """Validate a histogram of counts (non-negative integers, given length) and return int64."""
    arr = np.asarray(counts)
    if arr.ndim != 1 or arr.size != size:
        raise ValueError(f"{name} must be a 1-D array of length {size}, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating) and (
        not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr))
    ):
        raise ValueError(f"{name} must hold non-negative integer counts")
    if np.any(arr < 0):
        raise ValueError(f"{name} must hold non-negative counts")
    return arr.astype(np.int64)


def check_values(values: Any, n: int, domain_size: int, name: str = "values") -> np.ndarray:
    """A length-n int array with entries in [0, domain_size)."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-d array of length {n}, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= domain_size):
        raise ValueError(
            f"{name} must lie in [0, {domain_size}), got range [{arr.min()}, {arr.max()}]"
        )
    return arr


def check_contributions(
    contributions: Any, n: int, granularity: int, name: str = "contributions"
) -> np.ndarray:
    """f_i(x_r) ∈ [0, 1] per record, rounded to the 1/granularity grid (Kaplan–Mansour–Stemmer footnote 2); returned
    in integer units of 1/granularity so that sums are exact and the discrete noise applies."""
    arr = np.asarray(contributions, dtype=np.float64)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-d array of length {n}, got shape {arr.shape}")
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0):
        raise ValueError(f"{name} must lie in [0, 1]")
    return np.rint(arr * granularity).astype(np.int64)


class StrictModel(BaseModel):
    """Base of the configuration models: unknown keys are refused, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
