"""AboveThreshold (Kaplan–Mansour–Stemmer, "The sparse vector technique, revisited", COLT 2021,
arXiv 2011.07637: Alg. 2), ThresholdMonitor (Alg. 3) and ThresholdMonitorEvolving (Alg. 5).

Noise is the discrete Laplace (exact sampler, :mod:`pipeline.privacy.noise`) on the lattice of the
query values: counting queries are integer-valued; fractional contributions f_i(x) ∈ [0, 1] are
rounded to the grid 1/``granularity`` (Kaplan–Mansour–Stemmer, footnote 2 — the paper itself discretises this way)
and noise scales are multiplied by ``granularity`` so the mechanism is the paper's on that grid.
The privacy proofs use the Laplace shift ratio Pr[w]/Pr[w − f] ≤ e^{f/b} and tail ratios for shifts
by query values; both hold exactly for the discrete Laplace when the shifts are lattice points.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.privacy.events import ApproxDP
from pipeline.privacy.laws import CappedSumLaw, lower_quantile, upper_quantile
from pipeline.privacy.noise import discrete_laplace, used_scale
from pipeline.validation import check_contributions, check_int, check_real, check_values

from . import calibration as cal
from .sparse import active_histogram, sparse_flags
from .state import StatefulMixin

__all__ = ["AboveThreshold", "ThresholdMonitor", "ThresholdMonitorEvolving"]


class AboveThreshold(StatefulMixin):
    """Kaplan–Mansour–Stemmer Algorithm 2: t̂ = t + Lap(2/ε) once; per query f̂ = f(S) + Lap(4/ε); ⊤ and halt at the
    first f̂ ≥ t̂. ε-DP for sensitivity-1 queries (Theorem 2.5). Queries must be integer-valued
    (counts); both noises are discrete Laplace.
    """

    _state_fields = ("epsilon", "threshold", "noisy_threshold", "halted", "queries")

    def __init__(self, epsilon: float, threshold: int, seed: Any = None):
        self.epsilon = check_real(epsilon, "epsilon", low=0.0, low_open=True)
        self.threshold = check_int(threshold, "threshold")
        self._rng_init(seed)
        self.noisy_threshold = int(
            self.threshold + discrete_laplace(2.0 / self.epsilon, 1, self._source)[0]
        )
        self.halted = False
        self.queries = 0

    @property
    def privacy(self) -> ApproxDP:
        return ApproxDP(self.epsilon, 0.0)

    def query(self, value: int) -> bool:
        """``value`` = f_i(S), an integer of a sensitivity-1 query. Returns True for ⊤ (then halts)."""
        if self.halted:
            raise RuntimeError("AboveThreshold has halted after its first ⊤")
        value = check_int(value, "value")
        self.queries += 1
        noisy = value + int(discrete_laplace(4.0 / self.epsilon, 1, self._source)[0])
        if noisy >= self.noisy_threshold:
            self.halted = True
            return True
        return False


class ThresholdMonitor(StatefulMixin):
    """Kaplan–Mansour–Stemmer Algorithm 3 over a fixed database of ``n_records`` records.

    Parameters ``epsilon``, ``delta`` are the algorithm's own (ε, δ) (they set the noise); the
    mechanism is (ξ, 3δ)-DP for add/remove with ξ = 75(k+1)ε/ln(1/δ) + 25ε (Theorem 3.2), see
    :attr:`privacy`. Use :meth:`from_target` to calibrate from a target (ε, δ).

    Per query f_i (given as the vector of f_i(x_r) ∈ [0, 1] over records r):
    Δ = (1/ε)ln(1/δ)ln((1/ε)ln(1/δ)); w ~ Lap(10Δ); v ~ Lap((1/ε)ln(1/δ)); v̄ = min(v, Δ);
    f̂ = Σ_{r not deleted} f_i(x_r) + w + v̄; ⊥ if f̂ < t, else ⊤ and c(r) += f_i(x_r) for every r,
    deleting records with c(r) ≥ k.
    """

    _state_fields = (
        "n",
        "epsilon",
        "delta",
        "threshold",
        "k",
        "granularity",
        "counters",
        "queries",
        "tops",
    )

    def __init__(
        self,
        n_records: int,
        epsilon: float,
        delta: float,
        threshold: float,
        k: float,
        granularity: int = 1,
        seed: Any = None,
    ):
        self.n = check_int(n_records, "n_records", low=0)
        self.epsilon = check_real(epsilon, "epsilon", low=0.0, low_open=True)
        self.delta = check_real(delta, "delta", low=0.0, high=1.0, low_open=True, high_open=True)
        self.threshold = check_real(threshold, "threshold")
        self.k = check_real(k, "k", low=0.0, low_open=True)
        self.granularity = check_int(granularity, "granularity", low=1)
        cal.threshold_monitor_noise(self.epsilon, self.delta)  # validates ln(1/δ)/ε > e
        self._rng_init(seed)
        self.counters = np.zeros(self.n, dtype=np.int64)  # units of 1/granularity
        self.queries = 0
        self.tops = 0
        self._after_restore()

    @classmethod
    def from_target(
        cls,
        n_records: int,
        epsilon: float,
        delta: float,
        threshold: float,
        k: float,
        neighbours: str = "replace",
        **kwargs,
    ):
        """Calibrate (ε̃, δ̃) so the monitor is (epsilon, delta)-DP (:func:`calibrate_threshold_monitor`)."""
        eps_t, delta_t = cal.calibrate_threshold_monitor(epsilon, delta, k, neighbours)
        return cls(n_records, eps_t, delta_t, threshold, k, **kwargs)

    def _after_restore(self) -> None:
        big_delta, s_w, s_v = cal.threshold_monitor_noise(self.epsilon, self.delta)
        g = self.granularity
        self.big_delta = big_delta
        self._scale_w = used_scale(s_w * g)
        self._scale_v = used_scale(s_v * g)
        self._cap_units = big_delta * g
        self._k_units = self.k * g
        self._t_units = self.threshold * g
        self.noise_law = CappedSumLaw(self._scale_w, self._scale_v, self._cap_units)

    # -- privacy and utility ---------------------------------------------------------------------
    def privacy(self, neighbours: str = "add_remove") -> ApproxDP:
        """Theorem 3.2 (with group privacy for ``replace``), see :func:`threshold_monitor_privacy`."""
        return cal.threshold_monitor_privacy(self.epsilon, self.delta, self.k, neighbours)

    def utility_margins(self, m: int, beta: float) -> tuple[float, float]:
        """Explicit form of Theorem 3.1: with probability ≥ 1 − β over m queries, every ⊤ has
        f_i(S_i) > t − upper and every ⊥ has f_i(S_i) < t + lower, where (upper, lower) are the
        smallest lattice margins with P(w + v̄ ≥ upper), P(w + v̄ ≤ −lower) ≤ β/(2m) (union bound,
        exact tails of the discrete noise). Returned in query units as (upper, lower)."""
        m = check_int(m, "m", low=1)
        beta = check_real(beta, "beta", low=0.0, high=1.0, low_open=True, high_open=True)
        log_p = math.log(beta / (2.0 * m))
        g = self.granularity
        return upper_quantile(self.noise_law, log_p) / g, lower_quantile(self.noise_law, log_p) / g

    # -- queries ---------------------------------------------------------------------------------
    @property
    def active(self) -> np.ndarray:
        """Records not deleted (c(r) < k)."""
        return self.counters < self._k_units

    def _noise(self, size: int) -> np.ndarray:
        w = discrete_laplace(self._scale_w, size, self._source).astype(np.float64)
        v = discrete_laplace(self._scale_v, size, self._source).astype(np.float64)
        return w + np.minimum(v, self._cap_units)

    def query(self, contributions: Any) -> bool:
        """One query: ``contributions[r]`` = f_i(x_r) ∈ [0, 1]. Returns True for ⊤."""
        units = check_contributions(contributions, self.n, self.granularity)
        total = int(units[self.active].sum())
        self.queries += 1
        if total + self._noise(1)[0] < self._t_units:
            return False
        self.tops += 1
        self.counters += units  # every record, as in step 3e (deleted records stay deleted)
        return True


class ThresholdMonitorEvolving(ThresholdMonitor):
    """Kaplan–Mansour–Stemmer Algorithm 5: n users whose inputs change every round; counters c(j) per user; users
    with c(j) ≥ k are no longer counted. By Theorem 4.4's reduction this is ThresholdMonitor run on the
    fixed database of user indices with the query f_i(j) = q_i(x_{i,j}), so the noise and privacy are
    ThresholdMonitor's at the internal (ε̃, δ̃) (Δ₁ = Δ(ε̃, δ̃), Δ₂ = ln(1/δ̃)/ε̃); see
    :func:`pipeline.monitors.calibration.threshold_monitor_privacy` for the resulting (ε, δ).

    :meth:`query` takes the round's vector q_i(x_{i,j}) over users. :meth:`query_all_elements` asks,
    in one round of the data, the |X| indicator queries f_x(y) = 1{y = x} (Theorem 4.7's use) in
    O(n + |support|) — see its docstring for why this equals querying every element in turn.
    """

    def query_all_elements(self, values: Any, domain_size: int) -> np.ndarray:
        """One step of the shifting heavy-hitters use: users' current elements ``values`` (length n,
        entries < ``domain_size``); returns the sorted ids x with answer ⊤ to f_x.

        Sequential-equivalence: the |X| queries of a step are asked in any fixed order. A ⊤ on f_x
        only changes the counters of users holding x, who contribute 0 to every other f_y of the
        step, so each f_y's active count is the same whether earlier queries of the step were ⊤ or
        not; the queries of a step are therefore independent given the counters at the step start,
        and can be answered together. Each query has its own fresh (w, v): support elements get
        explicit noise; the zero-count elements are handled by :func:`sparse_flags` (Binomial count
        with p = P(w + v̄ ≥ t), drawn exactly against the law's tail intervals, then uniform ids).
        """
        if self.granularity != 1:
            raise ValueError("query_all_elements needs granularity=1 (indicator queries)")
        domain_size = check_int(domain_size, "domain_size", low=1)
        vals = check_values(values, self.n, domain_size)
        support, counts = active_histogram(vals[self.active], domain_size)
        flagged = self.flag_histogram(support, counts, domain_size)
        if flagged.size:
            # c(j) += f_x(x_{i,j}) = 1 for every user holding a flagged element (step 3e)
            self.counters[np.isin(vals, flagged)] += 1
        return flagged

    def flag_histogram(
        self, support: np.ndarray, counts: np.ndarray, domain_size: int
    ) -> np.ndarray:
        """The noisy part of :meth:`query_all_elements` from the active users' histogram alone
        (sorted distinct ``support`` ids and their ``counts``); per-user counters are not touched.

        The stream uses this split: workers count their active users and charge them when told the
        flagged set; the releaser only sees the summed histogram. Same draws in the same order as
        :meth:`query_all_elements`, so both paths give the same output for the same source.
        """
        if self.granularity != 1:
            raise ValueError("flag_histogram needs granularity=1 (indicator queries)")
        support = np.asarray(support, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        noisy = counts + self._noise(support.size)
        hit = noisy >= self._t_units
        t_units = self._t_units
        flagged, _ = sparse_flags(
            self._source,
            domain_size,
            support,
            hit,
            lambda digits: self.noise_law.sf_interval(t_units, digits),
        )
        self.queries += domain_size
        self.tops += int(flagged.size)
        return flagged
