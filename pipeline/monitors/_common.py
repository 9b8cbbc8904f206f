"""Shared helpers: argument checks that name the argument, the per-step active histogram, and the
sparse "query every element of the domain" step used by the heavy-hitter engines."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.privacy.noise import exact_scale
from pipeline.privacy.rng import RandomSource, as_random_source, random_source_from_state

from ._exact import ProbabilityFn
from ._laws import binomial_draw, choose_absent_ids
from pipeline.validation import check_int, check_real  # noqa: F401  (re-exported)



def check_values(values: Any, n: int, domain_size: int, name: str = "values") -> np.ndarray:
    """A length-n int array with entries in [0, domain_size)."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-d array of length {n}, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= domain_size):
        raise ValueError(f"{name} must lie in [0, {domain_size}), got range [{arr.min()}, {arr.max()}]")
    return arr


def check_contributions(contributions: Any, n: int, granularity: int, name: str = "contributions") -> np.ndarray:
    """f_i(x_r) ∈ [0, 1] per record, rounded to the 1/granularity grid (Kaplan–Mansour–Stemmer footnote 2); returned
    in integer units of 1/granularity so that sums are exact and the discrete noise applies."""
    arr = np.asarray(contributions, dtype=np.float64)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-d array of length {n}, got shape {arr.shape}")
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0):
        raise ValueError(f"{name} must lie in [0, 1]")
    return np.rint(arr * granularity).astype(np.int64)


def used_scale(scale: float) -> float:
    """The scale the discrete Laplace sampler actually uses (possibly rounded up by < 2^-32)."""
    return float(exact_scale(scale))


def active_histogram(vals: np.ndarray, domain_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(support, counts): the sorted distinct elements among ``vals`` and their counts.
    One bincount when the domain is small relative to the input, else one np.unique (O(n log n))."""
    if vals.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if domain_size <= 4 * vals.size + (1 << 16):
        counts = np.bincount(vals, minlength=domain_size)
        support = np.flatnonzero(counts)
        return support.astype(np.int64), counts[support].astype(np.int64)
    support, counts = np.unique(vals, return_counts=True)
    return support.astype(np.int64), counts.astype(np.int64)


def sparse_flags(source: RandomSource, domain_size: int, support: np.ndarray, support_flagged: np.ndarray,
                 p_zero: ProbabilityFn) -> tuple[np.ndarray, np.ndarray]:
    """Add the zero-count elements to a step's flags without touching them one by one.

    Every element x outside ``support`` has count 0 and is flagged iff its own fresh noise N_x
    reaches the threshold, independently across x with the same probability p (``p_zero``: the
    noise law's tail as rigorous intervals, ``lambda d: law.sf_interval(t, d)``). The flagged subset
    F of the Z = domain_size − |support| zero-count ids is then a set of independent Bernoulli(p)
    indicators, whose law is: |F| ~ Binomial(Z, p) and, given |F| = K, F is uniform among the
    K-subsets (the indicators are exchangeable). K is drawn from Binomial(Z, p) exactly (inversion
    with exact comparisons, :mod:`pipeline.monitors._exact`) and the K ids uniformly with exact
    integer draws, so the output has exactly the law of querying every element.
    Returns (flagged ids sorted, the zero-count ids among them).
    """
    z = domain_size - support.size
    k = binomial_draw(source, z, p_zero) if z > 0 else 0
    zeros = choose_absent_ids(source, domain_size, support, k)
    flagged = support[support_flagged]
    if zeros.size:
        flagged = np.union1d(flagged, zeros)
    return flagged.astype(np.int64), zeros


class StatefulMixin:
    """get_state()/from_state() on top of ``_state_fields`` (arrays/scalars) plus the random source."""

    _state_fields: tuple[str, ...] = ()

    def _rng_init(self, seed: Any) -> None:
        self._source = as_random_source(seed)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"kind": type(self).__name__, "rng": self._source.get_state()}
        for name in self._state_fields:
            value = getattr(self, name)
            state[name] = value.copy() if isinstance(value, np.ndarray) else value
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]):
        if state.get("kind") != cls.__name__:
            raise ValueError(f"state is of kind {state.get('kind')!r}, not {cls.__name__}")
        obj = cls.__new__(cls)
        obj._source = random_source_from_state(state["rng"])
        for name in cls._state_fields:
            value = state[name]
            setattr(obj, name, value.copy() if isinstance(value, np.ndarray) else value)
        obj._after_restore()
        return obj

    def _after_restore(self) -> None:  # rebuild derived (non-state) attributes
        pass

