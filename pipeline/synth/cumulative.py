"""Cumulative-time synthesizer: Algorithm 2 + Appendix B of Bun, Gaboardi, Neunhoeffer & Zhang,
"Continual release of differentially private synthetic data from longitudinal data collections"
(arXiv 2306.07884), with a choice of continual counter.

Statistic. S_b^t = #{users with Hamming weight ≥ b after t steps}, b = 0..T. It is the prefix sum
of z_b^t = #{users with weight exactly b−1 after t−1 steps and x^t = 1}. b = 0 is exact:
S_0^t = n (the roster size, public by the deployment model).

Counters (``counter=``): "tree" — the binary tree mechanism (pipeline.counters.tree, the paper's
Algorithm 3); "factorization" — the square-root factorization on an integer lattice
(pipeline.counters.factorization.SqrtFactorizationCounter), the same privacy with a max error
1.87× smaller at T = 12 (2.5× at 120); "blt" — a BLT counter fitted to it (constant time and memory
per step); "auto" (default) — the factorization up to T = ``BLT_ABOVE_HORIZON`` (1024), the BLT
above (:func:`pipeline.counters.resolve_counter`; measured in jobs/bench/bench_counters.py and
jobs/eval/sipp_batch.py).

Privacy (Theorem 4.1). Counter b (b = 1..T) runs over t = b..T (horizon h_b = T − b + 1:
z_b^t = 0 for t < b) with budget ρ_b = ρ·w_b/Σ_b' w_b', so Σ_b ρ_b = ρ. Each counter is
ρ_b-zCDP for its stream: adding or removing one user changes, for each b, at most one z_b^t (the
step its weight reaches b), by 1; under replace the changed user's +1 in stream b can move from
one step to another (or appear/disappear), which each counter's calibration covers (the tree
doubles σ², the factorization computes the exact sensitivity). Composition over b gives ρ-zCDP
for a user's whole sequence. Monotonisation and the synthetic records are post-processing.

Weights (Appendix B, its re-derivation and docs/synthesizers.md §9.6). Let V(h) = ρ·max_t Var(S̃_t − S_t) of a counter of
horizon h (independent of ρ). Minimising the largest counter variance max_b V(h_b)/ρ_b subject to
Σ ρ_b = ρ equalises the terms (if one were larger, moving budget to it would lower the max), so
ρ_b ∝ V(h_b) and every counter's max variance is Σ_b V(h_b)/ρ. Monotonisation clips the short
counters' errors but not the long ones', so the shipped lattice split is w_b = V(h_b)·√h_b
(``SPLIT_EXPONENT``; exponent 0 is the minimax split, states saved before it keep it). For the
tree the paper's w_b = max(⌈log2 h_b⌉, 1)^3 is kept (unchanged behaviour); for the factorization
V(h_b) = Δ²(h_b)·Σ_{k<h_b} β_k²/2 is computed from the lattice factor
(:func:`pipeline.counters.factorization.unit_rho_max_variance`, per relation); the BLT uses the same
weights (its max variance is within 0.2% of the factorization's; the split only moves error between
counters, never privacy: each counter is calibrated to its own ρ_b).

Monotonisation (Algorithm 2): Ŝ_b^t = min(max(S̃_b^t, Ŝ_b^{t−1}), Ŝ_{b−1}^{t−1}) for 1 ≤ b ≤ t,
Ŝ_b^{b−1} = 0, Ŝ_0^t = n, Ŝ_b^t = 0 for b > t; so 0 ≤ Ŝ_b^t ≤ Ŝ_{b−1}^{t−1} ≤ n automatically.
Lemma 4.2: |Ŝ_b^t − S_b^t| ≤ max(|S̃_b^t − S_b^t|, |Ŝ_b^{t−1} − S_b^{t−1}|, |Ŝ_{b−1}^{t−1} − S_{b−1}^{t−1}|).

Synthetic data: m = n records. At step t, among the records whose *synthetic* weight is b−1
(Algorithm 2's pseudocode writes x; the text means x̂), ẑ_b^t = Ŝ_b^t − Ŝ_b^{t−1} chosen
uniformly at random get a 1, the others a 0. Then #{records with synthetic weight ≥ b} = Ŝ_b^t.

Public: S̃ (noisy_counts), Ŝ (monotone_counts), the synthetic records, ρ_b, the counter. Curator-side:
the users' real weights (held for the values path, hence in :meth:`get_state`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.privacy.neighbours import check_neighbours
from pipeline.privacy.rng import RandomSource, as_random_source, random_source_from_state
from pipeline.validation import check_beta, check_int, check_rho, coerce_counts, coerce_values

from .postprocess import assign_groups

__all__ = [
    "CumulativeSynthesizer",
    "DEFAULT_COUNTER",
    "SPLIT_EXPONENT",
    "counter_weights",
    "split_rhos",
    "union_bound_quantile",
]

_STATE_KIND = "CumulativeSynthesizer"
_STATE_VERSION = 1


DEFAULT_COUNTER = "auto"


# w_b = V(h_b)·h_b^γ for the lattice counters (docs/synthesizers.md §9.6): γ = 0 is the minimax
# split (every counter the same max variance); γ = 1/2 gives the long counters, whose errors
# monotonisation cannot clip, more of ρ. Chosen on a development panel, evaluated on others.
SPLIT_EXPONENT = 0.5


def counter_weights(
    horizon: int,
    counter: str = "tree",
    neighbours: str = "add_remove",
    exponent: float = SPLIT_EXPONENT,
) -> np.ndarray:
    """w_b for b = 1..T as float64 (index b − 1); ρ_b = ρ·w_b/Σw (module docstring).

    "tree": w_b = max(⌈log2(T − b + 1)⌉, 1)^3 (Appendix B as printed).
    "factorization" / "blt": w_b = V(h_b)·h_b^exponent, h_b = T − b + 1, V(h) the counter's max
    variance at unit ρ; counter b's max variance is then Σ_b' w_b'/(ρ·h_b^exponent)
    (exponent 0: the minimax split, every counter Σ_b w_b/ρ).
    """
    from pipeline.counters import resolve_counter
    from pipeline.counters.factorization import unit_rho_max_variance

    T = int(horizon)
    counter = resolve_counter(counter, T)
    neighbours = check_neighbours(neighbours)
    out = np.empty(T, dtype=np.float64)
    for b in range(1, T + 1):
        h = T - b + 1
        if counter == "tree":
            out[b - 1] = max((h - 1).bit_length(), 1) ** 3  # (h−1).bit_length() = ⌈log2 h⌉ exactly
        else:
            out[b - 1] = unit_rho_max_variance(h, neighbours) * float(h) ** exponent
    return out


def split_rhos(rho: float, weights: np.ndarray) -> np.ndarray:
    """ρ_b = ρ·w_b/Σw, the last entry set to ρ − Σ_{b<T} ρ_b so that Σ_b ρ_b = ρ in floating point
    (rounding only moves < 10⁻¹⁵·ρ to the shortest counter; no ρ_b exceeds its share by more)."""
    rhos = rho * weights / weights.sum()
    rhos[-1] = max(rho - float(rhos[:-1].sum()), 0.0)
    return rhos


def union_bound_quantile(variances: np.ndarray, beta: float, offset: float = 0.0) -> float:
    """Smallest α with Σ_c 2·exp(−(α − offset)²/(2·v_c)) ≤ beta: every cell c of variance-proxy v_c
    (sub-Gaussian) is within α with probability ≥ 1 − beta (union bound cell by cell, tighter
    than the largest variance times the number of cells). Bisection to 10⁻⁹ relative, rounded up."""
    v = np.asarray(variances, dtype=np.float64)
    v = v[v > 0]
    if v.size == 0:
        return offset

    def tail(a: float) -> float:
        return float(2.0 * np.exp(-(a * a) / (2.0 * v)).sum())

    lo, hi = 0.0, math.sqrt(2.0 * v.max() * math.log(2.0 * v.size / beta))  # hi is feasible
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if tail(mid) <= beta else (mid, hi)
    return hi + offset


def _check_exponent(exponent: float) -> float:
    value = float(exponent)
    if not (math.isfinite(value) and 0.0 <= value <= 2.0):
        raise ValueError(f"split_exponent must be a number in [0, 2], got {exponent!r}")
    return value


class CumulativeSynthesizer:
    """Continual synthetic binary data preserving all cumulative (Hamming-weight ≥ b) queries.

    Parameters
    ----------
    horizon : T. rho : total zCDP budget. beta : failure probability used by :meth:`error_bound`.
    neighbours : :class:`~pipeline.privacy.neighbours.Neighbours` or its value, "add_remove" or
        "replace" (passed to every counter, which calibrates for it). This release publishes n
        exactly, so add_remove is not coherent for it (n would differ between neighbours); it is
        kept to reproduce the paper's constants. A stream deployment is always replace.
    counter : "auto" (default: "factorization" up to T = 1024, "blt" above), "factorization", "blt"
        or "tree": the continual counter behind each S̃_b.
    seed : None (secure OS randomness), int (seeded, tests only) or a RandomSource.
    n : roster size; required for the counts path, otherwise fixed by the first ``update``.

    ``update(values)`` (one bit per user) or ``release_counts(z_t)`` (z_t[b] = #users whose weight
    goes from b−1 to b at this step, length T + 1, z_t[0] = 0) once per step; both return the new
    synthetic column as an int array of shape (n, 1), and give bit-for-bit identical results.
    """

    def __init__(
        self,
        horizon: int,
        rho: float,
        beta: float = 0.05,
        neighbours: str = "add_remove",
        seed: RandomSource | int | None = None,
        *,
        n: int | None = None,
        counter: str = DEFAULT_COUNTER,
        split_exponent: float = SPLIT_EXPONENT,
    ):
        self.horizon = check_int(horizon, "horizon", low=1)
        self.rho = check_rho(rho)
        self.beta = check_beta(beta)
        self.neighbours = check_neighbours(neighbours)
        self.n = None if n is None else check_int(n, "n", low=1)
        from pipeline.counters import make_counter, resolve_counter

        self.counter = resolve_counter(counter, self.horizon)
        self._rng = as_random_source(seed)
        self.split_exponent = _check_exponent(split_exponent)
        w = counter_weights(self.horizon, self.counter, self.neighbours, self.split_exponent)
        self.rhos = split_rhos(self.rho, w)  # ρ_b at index b − 1, Σ_b ρ_b = ρ
        self._counters = []
        for b in range(1, self.horizon + 1):  # counter b runs over t = b..T; one shared source
            self._counters.append(
                make_counter(
                    self.counter,
                    self.horizon - b + 1,
                    float(self.rhos[b - 1]),
                    seed=self._rng,
                    neighbours=self.neighbours,
                )
            )
        self.t = 0
        self._mode: str | None = None
        self._weights: np.ndarray | None = None  # curator-side real weights
        self._syn: np.ndarray | None = None
        self._syn_weights: np.ndarray | None = None
        self._noisy: list[np.ndarray] = []
        self._monotone: list[np.ndarray] = []
        self._s_hat: np.ndarray | None = None  # Ŝ^{t} for b = 0..T

    # ---------------------------------------------------------------------------------------
    @property
    def m(self) -> int | None:
        return self.n

    @property
    def counters(self) -> list:
        """The T counters (index b − 1); read their ``sigma2``/``variance_at``."""
        return list(self._counters)

    def counter_variance(self, b: int, t: int) -> float:
        """Variance of S̃_b^t − S_b^t: counter b's, at its local time t − b + 1."""
        return float(self._counters[b - 1].variance_at(t - b + 1))

    @property
    def synthetic(self) -> np.ndarray:
        if self._syn is None:
            return np.zeros((0, 0), dtype=np.int8)
        view = self._syn[:, : self.t]
        view.flags.writeable = False
        return view

    @property
    def noisy_counts(self) -> dict[int, np.ndarray]:
        """S̃^t per step, length T + 1 indexed by b (entry 0 = n exact, entries b > t = 0)."""
        return {t + 1: a.copy() for t, a in enumerate(self._noisy)}

    @property
    def monotone_counts(self) -> dict[int, np.ndarray]:
        """Ŝ^t per step, length T + 1 indexed by b (Ŝ_0 = n, Ŝ_b = 0 for b > t)."""
        return {t + 1: a.copy() for t, a in enumerate(self._monotone)}

    @property
    def secure(self) -> bool:
        return bool(self._rng.secure)

    def error_bound(self, beta: float | None = None) -> float:
        """Count error bound holding for all (b, t) simultaneously with probability ≥ 1 − beta.

        Corollary B.1 recomputed with the counters' exact variances: each S̃_b^t − S_b^t is a
        linear combination of independent discrete Gaussians (N_Z(0, σ²) is σ²-sub-Gaussian,
        Canonne, Kamath & Steinke 2020), so it is Var_b(t)-sub-Gaussian with
        Var_b(t) = variance_at(t − b + 1), and P(|S̃_b^t − S_b^t| > a) ≤ 2·exp(−a²/(2·Var_b(t))).
        A union bound cell by cell over the T(T+1)/2 pairs gives the smallest α with
        Σ_{b,t} 2·exp(−α²/(2·Var_b(t))) ≤ beta (:func:`union_bound_quantile`; never above the
        largest variance's √(2·max Var·ln(T(T+1)/beta))), plus 1/2 for the factorization and BLT
        counters' final rounding to an integer (plus, for the BLT, its deterministic rounding
        residual, ``BLTCounter.residual_bound``, < 10⁻⁴). Lemma 4.2 carries it to Ŝ (it is
        deterministic: max |Ŝ − S| ≤ max |S̃ − S|). The bound is data-independent, so it cannot
        use the clipping, which helps only where the data leave room (docs/synthesizers.md §9.6).
        """
        beta = self.beta if beta is None else check_beta(beta)
        T = self.horizon
        cells = np.array(
            [self.counter_variance(b, t) for b in range(1, T + 1) for t in range(b, T + 1)]
        )
        rounding = 0.0 if self.counter == "tree" else 0.5
        if self.counter == "blt":
            rounding += max(c.residual_bound() for c in self._counters)
        return union_bound_quantile(cells, beta, rounding)

    def paper_alpha_star(self, beta: float | None = None) -> float:
        """Corollary B.1 as printed (tree weights), in counts (n·α*): √(Σ_b w_b / ρ · ln(1/β)), β* = Tβ."""
        beta = self.beta if beta is None else check_beta(beta)
        return math.sqrt(counter_weights(self.horizon).sum() / self.rho * math.log(1.0 / beta))

    def parameters(self) -> dict[str, Any]:
        return {
            "mechanism": "cumulative",
            "horizon": self.horizon,
            "rho": self.rho,
            "rhos": [float(r) for r in self.rhos],
            "beta": self.beta,
            "neighbours": self.neighbours,
            "counter": self.counter,
            "split_exponent": self.split_exponent,
            "m": self.n,
        }

    # ---------------------------------------------------------------------------------------
    def _set_mode(self, mode: str) -> None:
        if self._mode is None:
            self._mode = mode
        elif self._mode != mode:
            raise RuntimeError(
                f"this synthesizer is driven by {self._mode}; do not mix update() and release_counts()"
            )

    def update(self, values) -> np.ndarray:
        """Consume one step of bits (one per user) and release the new synthetic column (n, 1)."""
        if self.t >= self.horizon:
            raise RuntimeError(f"horizon reached: all {self.horizon} steps were already consumed")
        x = coerce_values(values, 2, self.n, "values")
        self._set_mode("values")
        if self.n is None:
            self.n = int(x.size)
        if self._weights is None:
            self._weights = np.zeros(self.n, dtype=np.int64)
        ones = x == 1
        z = np.bincount(self._weights[ones] + 1, minlength=self.horizon + 1).astype(np.int64)
        self._weights = self._weights + x
        return self._release(z)

    def release_counts(self, z_t) -> np.ndarray:
        """Release the next step from z_t (length T + 1; z_t[b] = #users whose weight goes b−1 → b)."""
        if self.t >= self.horizon:
            raise RuntimeError(f"horizon reached: all {self.horizon} steps were already consumed")
        if self.n is None:
            raise ValueError(
                "n (the roster size) must be given to the constructor to use release_counts"
            )
        z = coerce_counts(z_t, self.horizon + 1, "z_t")
        step = self.t + 1
        if z[0] != 0:
            raise ValueError(f"z_t[0] must be 0 (no user reaches weight 0), got {z[0]}")
        if np.any(z[step + 1 :] != 0):
            raise ValueError(f"z_t[b] must be 0 for b > t = {step} (weights cannot exceed t)")
        if int(z.sum()) > self.n:
            raise ValueError(f"z_t sums to {int(z.sum())} > n = {self.n}")
        self._set_mode("counts")
        return self._release(z)

    def _release(self, z: np.ndarray) -> np.ndarray:
        T, n, t = self.horizon, self.n, self.t + 1
        assert n is not None  # set by update() or checked by release_counts() before a release
        if self._syn is None:
            self._syn = np.zeros((n, T), dtype=np.int8)
            self._syn_weights = np.zeros(n, dtype=np.int64)
            self._s_hat = np.zeros(T + 1, dtype=np.int64)
            self._s_hat[0] = n
        assert self._syn_weights is not None and self._s_hat is not None  # allocated with _syn
        prev = self._s_hat
        noisy = np.zeros(T + 1, dtype=np.int64)
        noisy[0] = n
        new = np.zeros(T + 1, dtype=np.int64)
        new[0] = n
        for b in range(1, t + 1):
            noisy[b] = int(self._counters[b - 1].update(int(z[b])))
            new[b] = min(max(int(noisy[b]), int(prev[b])), int(prev[b - 1]))
        ones = new - prev  # ẑ_b^t at index b (b ≥ 1); index 0 unused
        # records with synthetic weight w = b − 1: prev[w] − prev[w + 1]; ẑ_{w+1} of them get a 1
        sizes = prev[:t] - prev[1 : t + 1]
        k1 = ones[1 : t + 1]
        counts = np.stack([sizes - k1, k1], axis=1)
        labels = assign_groups(self._syn_weights, counts, self._rng)
        self._syn[:, t - 1] = labels
        self._syn_weights = self._syn_weights + labels
        self._s_hat = new
        self._noisy.append(noisy)
        self._monotone.append(new.copy())
        self.t = t
        return self._syn[:, t - 1 : t].copy()

    # ---------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (curator-side: holds the users' real weights)."""
        T = self.horizon
        return {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "params": {
                "horizon": T,
                "rho": self.rho,
                "beta": self.beta,
                "neighbours": self.neighbours,
                "n": self.n,
                "counter": self.counter,
                "split_exponent": self.split_exponent,
            },
            "t": self.t,
            "mode": self._mode,
            "weights": self._weights,
            "synthetic": None if self._syn is None else self._syn[:, : self.t].copy(),
            "syn_weights": self._syn_weights,
            "s_hat": self._s_hat,
            "noisy": np.asarray(self._noisy, dtype=np.int64).reshape(-1, T + 1),
            "monotone": np.asarray(self._monotone, dtype=np.int64).reshape(-1, T + 1),
            "counters": [c.get_state(include_rng=False) for c in self._counters],
            "rng": self._rng.get_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CumulativeSynthesizer:
        if state.get("kind") != _STATE_KIND:
            raise ValueError(f"not a {_STATE_KIND} state (kind={state.get('kind')!r})")
        from pipeline.counters import check_counter, counter_from_state

        p = state["params"]
        obj = cls.__new__(cls)
        obj.horizon = check_int(p["horizon"], "horizon", low=1)
        obj.rho = check_rho(p["rho"])
        obj.beta = check_beta(p["beta"])
        obj.neighbours = check_neighbours(p["neighbours"])
        obj.n = None if p["n"] is None else int(p["n"])
        obj.counter = check_counter(p.get("counter", "tree"))  # states from before the option: tree
        obj._rng = random_source_from_state(state["rng"])
        # states from before the weighted split used the minimax split (exponent 0)
        obj.split_exponent = _check_exponent(p.get("split_exponent", 0.0))
        w = counter_weights(obj.horizon, obj.counter, obj.neighbours, obj.split_exponent)
        obj.rhos = split_rhos(obj.rho, w)
        obj._counters = [counter_from_state(s, rng=obj._rng) for s in state["counters"]]
        obj.t = int(state["t"])
        obj._mode = state["mode"]
        obj._weights = (
            None
            if state["weights"] is None
            else np.asarray(state["weights"], dtype=np.int64).copy()
        )
        obj._syn = None
        if state["synthetic"] is not None:
            syn = np.asarray(state["synthetic"])
            obj._syn = np.zeros((syn.shape[0], obj.horizon), dtype=np.int8)
            obj._syn[:, : syn.shape[1]] = syn
        obj._syn_weights = (
            None
            if state["syn_weights"] is None
            else np.asarray(state["syn_weights"], dtype=np.int64).copy()
        )
        obj._s_hat = (
            None if state["s_hat"] is None else np.asarray(state["s_hat"], dtype=np.int64).copy()
        )
        obj._noisy = [np.asarray(r, dtype=np.int64).copy() for r in np.asarray(state["noisy"])]
        obj._monotone = [
            np.asarray(r, dtype=np.int64).copy() for r in np.asarray(state["monotone"])
        ]
        return obj

    def __repr__(self) -> str:
        return (
            f"CumulativeSynthesizer(horizon={self.horizon}, rho={self.rho}, neighbours={self.neighbours!r}, "
            f"counter={self.counter!r}, t={self.t}, n={self.n})"
        )
