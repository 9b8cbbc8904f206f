"""SVT with individual privacy charging (Cohen, Lyu, "The target-charging technique for privacy
analysis across interactive computations", NeurIPS 2023, Algorithm 5) and its accountant (Theorem B.4).

Per query (f_i, T_i): f̂ = Σ_{x ∈ D} f_i(x) + Lap(1/ε₀); if f̂ ≥ T_i publish f̂ and charge every
present record with f_i(x) > 0 (C_x += 1, removed when C_x = τ); else publish ⊥.

Noise: discrete Laplace with pmf ∝ exp(−ε₀|x|) on integer (or 1/granularity-grid) sums — an
ε₀-DP call for sensitivity-1 queries, which is all the NotPrior target needs (q = 1/(e^{ε₀}+1)).
Privacy per user: :func:`pipeline.monitors.calibration.individual_charging_privacy` (argument in
docs/monitors.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.privacy.laws import DiscreteLaplaceLaw
from pipeline.privacy.noise import discrete_laplace, used_scale
from pipeline.validation import check_contributions, check_int, check_real, check_values

from . import calibration as cal
from .calibration import TargetChargingAccountant
from .sparse import active_histogram, sparse_flags
from .state import StatefulMixin

__all__ = ["IndividualChargingSVT", "TargetChargingAccountant"]


class IndividualChargingSVT(StatefulMixin):
    """Cohen–Lyu Algorithm 5 over ``n_records`` records (users), noise Lap(1/epsilon0), removal after
    ``tau`` hits. :meth:`query` answers one query (returns the published noisy value, or None for ⊥);
    :meth:`query_all_elements` answers the |X| indicator queries of a heavy-hitter step at once and
    returns (flagged ids, their published noisy counts)."""

    _state_fields = ("n", "epsilon0", "tau", "granularity", "counters", "queries", "hits")

    def __init__(
        self, n_records: int, epsilon0: float, tau: int, granularity: int = 1, seed: Any = None
    ):
        self.n = check_int(n_records, "n_records", low=0)
        self.epsilon0 = check_real(epsilon0, "epsilon0", low=0.0, low_open=True)
        self.tau = check_int(tau, "tau", low=1)
        self.granularity = check_int(granularity, "granularity", low=1)
        self._rng_init(seed)
        self.counters = np.zeros(self.n, dtype=np.int64)
        self.queries = 0
        self.hits = 0
        self._after_restore()

    @classmethod
    def from_target(
        cls,
        n_records: int,
        epsilon: float,
        delta: float,
        tau: int,
        neighbours: str = "replace",
        **kw,
    ):
        """ε₀ from :func:`calibrate_individual_charging` (Theorem B.4 per user)."""
        return cls(
            n_records, cal.calibrate_individual_charging(epsilon, delta, tau, neighbours), tau, **kw
        )

    def _after_restore(self) -> None:
        self._scale = used_scale(self.granularity / self.epsilon0)
        self.noise_law = DiscreteLaplaceLaw(self._scale)

    def privacy(self, delta: float, neighbours: str = "replace") -> cal.TCTBound:
        return cal.individual_charging_privacy(self.epsilon0, self.tau, delta, neighbours)

    @property
    def active(self) -> np.ndarray:
        """Records still in D (C_x < τ)."""
        return self.counters < self.tau

    def query(self, contributions: Any, threshold: float) -> float | None:
        """``contributions[r]`` = f_i(x_r) ∈ [0, 1]; returns f̂ (published) if f̂ ≥ threshold, else None."""
        units = check_contributions(contributions, self.n, self.granularity)
        threshold = check_real(threshold, "threshold")
        act = self.active
        total = int(units[act].sum())
        noisy = (total + int(discrete_laplace(self._scale, 1, self._source)[0])) / self.granularity
        self.queries += 1
        if noisy < threshold:
            return None
        self.hits += 1
        self.counters[act & (units > 0)] += 1
        return noisy

    def query_all_elements(
        self, values: Any, domain_size: int, threshold: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The |X| indicator queries f_x(y) = 1{y = x} of one step with threshold T (an integer).

        Same sequential-equivalence as ThresholdMonitorEvolving.query_all_elements: a hit on f_x only
        charges users holding x, who contribute to no other query of the step. Zero-count elements:
        flagged iff their noise N ≥ T, p = ρ^T/(1+ρ) (discrete Laplace tail); their published value is
        N given N ≥ T, i.e. T + Geometric (memoryless), drawn only for the flagged ones. Both draws
        are exact (:mod:`pipeline.privacy.exact`).
        """
        if self.granularity != 1:
            raise ValueError("query_all_elements needs granularity=1 (indicator queries)")
        domain_size = check_int(domain_size, "domain_size", low=1)
        threshold = check_int(threshold, "threshold", low=1)
        vals = check_values(values, self.n, domain_size)
        act = self.active
        support, counts = active_histogram(vals[act], domain_size)
        flagged, published = self.flag_histogram(support, counts, domain_size, threshold)
        if flagged.size:
            # charge present users holding a flagged element (C_x += 1; removed at τ)
            self.counters[act & np.isin(vals, flagged)] += 1
        return flagged, published

    def flag_histogram(
        self, support: np.ndarray, counts: np.ndarray, domain_size: int, threshold: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The noisy part of :meth:`query_all_elements` from the active users' histogram alone
        (sorted ``support`` ids, their ``counts``); per-user counters are not touched (the stream's
        workers charge their users from the flagged set). Same draws, same order."""
        threshold = check_int(threshold, "threshold", low=1)
        support = np.asarray(support, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        noisy = counts + discrete_laplace(self._scale, support.size, self._source)
        hit = noisy >= threshold
        flagged, zeros = sparse_flags(
            self._source,
            domain_size,
            support,
            hit,
            lambda digits: self.noise_law.sf_interval(threshold, digits),
        )
        published = np.empty(flagged.size, dtype=np.int64)
        if flagged.size:
            pos = np.searchsorted(support, flagged)
            pos_c = np.minimum(pos, max(support.size - 1, 0))
            in_support = (
                (support.size > 0) & (support[pos_c] == flagged)
                if support.size
                else np.zeros(flagged.size, bool)
            )
            published[in_support] = noisy[pos_c[in_support]]
            published[~in_support] = self.noise_law.sample_conditional_tail(
                self._source, threshold, int((~in_support).sum())
            )
        self.queries += domain_size
        self.hits += int(flagged.size)
        return flagged, published
