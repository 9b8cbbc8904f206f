"""Fixed-time-window synthesizer: Algorithm 1 of Bun, Gaboardi, Neunhoeffer, Zhang, "Continual
release of differentially private synthetic data from longitudinal data collections" (PACMMOD 2024;
arXiv 2306.07884),
generalised to a categorical alphabet of ``categories`` values.

Privacy (Theorem 3.1). At every update step t = k..T (R = T − k + 1 steps) the histogram C^t of
the users' length-k windows over the A^k patterns gets independent discrete Gaussian noise
N_Z(0, σ²) per bin, with

    σ² = factor · R / (2ρ),   factor = 1 (add_remove) or 2 (replace).

add_remove: adding or removing one user changes one bin of each step's histogram by 1 (L2
sensitivity 1), so each step is 1/(2σ²) = ρ/R-zCDP and the R steps compose to ρ-zCDP
(Theorem 3.1's calibration). replace: one bin loses 1 and another gains 1 (L2 sensitivity √2),
so σ² doubles to keep the total at ρ. Everything after the noise (padding, projection, rounding,
clamping, the synthetic records) is post-processing. The privacy unit is a user's whole sequence.

Accuracy (Theorem 3.2, Corollary 3.1, generalised; derivation in docs/synthesizers.md): with
n_pad = ceil((√(2σ²) + c_A)·√ln(A^k R/β)), c_A = ½·√(A/(A−1)) (= 1/√2 for A = 2, the paper's
constant), all projected counts p_s^t are non-negative with probability ≥ 1 − β, and the two-sided
bound max_{s,t} |p_s^t − (C_s^t + n_pad)| ≤ λ = (√(2σ²) + c_A)·√ln(2·A^k R/β) holds with
probability ≥ 1 − β (the paper's union bound uses a one-sided tail; the factor 2 restores it).

Curator-side vs public: the noisy counts Ĉ^t, the projected counts p^t, the clamp events, m,
n_pad and the synthetic records are public. The per-user window codes held for the values path
(and therefore :meth:`get_state`) are curator-side raw data. True counts are never stored.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.privacy.neighbours import check_neighbours, sensitivity_factor
from pipeline.privacy.rng import RandomSource, as_random_source, random_source_from_state
from pipeline.validation import check_beta, check_int, check_rho, coerce_counts, coerce_values

from .postprocess import assign_groups, clamp_children, project_children, synthetic_dtype

#: Largest histogram (categories ** window bins) a fixed-window synthesizer accepts. Each step
#: keeps its noisy and projected histograms (int64), so the bound keeps memory per step ≤ 16 MiB.
MAX_BINS = 1 << 20

__all__ = ["FixedWindowSynthesizer", "rounding_constant", "rounding_proxy"]

_STATE_KIND = "FixedWindowSynthesizer"
_STATE_VERSION = 1


def _discrete_gaussian(sigma2: float, size: int, rng: RandomSource) -> np.ndarray:
    from pipeline.privacy.noise import discrete_gaussian  # shared exact CKS sampler

    return np.asarray(discrete_gaussian(sigma2, size, rng=rng), dtype=np.int64)


def rounding_proxy(categories: int) -> float:
    """v_A = A / (4(A − 1)): bound on the sub-Gaussian variance proxy of the accumulated rounding.

    The rounding of a group at lag j reaches a bin with weight A^−j, through A^j independent groups,
    each a mean-zero term of range 1 (proxy ¼): Σ_j A^j·A^−2j/4 ≤ A/(4(A−1)).
    """
    a = int(categories)
    return a / (4.0 * (a - 1))


def rounding_constant(categories: int, sigma2: float) -> float:
    """c_A with √(2(σ² + v_A)) ≤ √(2σ²) + c_A.

    c_A = √v_A = ½·√(A/(A−1)) works whenever σ ≥ √(v_A/8) (σ ≥ ¼ suffices for every A, since
    v_A ≤ ½); for A = 2 it is the paper's 1/√2. For (absurdly) small σ fall back to √(2 v_A).
    """
    v = rounding_proxy(categories)
    if math.sqrt(sigma2) >= math.sqrt(v / 8.0):
        return math.sqrt(v)
    return math.sqrt(2.0 * v)


class FixedWindowSynthesizer:
    """Continual synthetic data preserving every length-``window`` histogram (Algorithm 1).

    Parameters
    ----------
    horizon : T, number of steps (known up front).
    window : k, 1 ≤ k ≤ T.
    rho : total zCDP budget ρ > 0 of the whole run.
    beta : failure probability of the padding/accuracy guarantee, in (0, 1).
    categories : alphabet size A ≥ 2 (values are codes 0..A−1); A^k ≤ 2^20 bins.
    neighbours : :class:`~pipeline.privacy.neighbours.Neighbours` or its value: "add_remove"
        (σ² = R/(2ρ)) or "replace" (σ² = R/ρ). add_remove is coherent only for batch use where a
        user really disappears from the histogram (no imputation) and n is not published; a stream
        deployment (fixed public roster, imputation) is always replace (docs/privacy.md).
    seed : None → secure OS randomness (production); int → seeded PCG64 (simulation/tests only);
        or a :class:`RandomSource`.
    n : optional roster size; when given, every step must have exactly n users.
    n_pad : optional override of the padding per bin, for experiments only. It forfeits the
        Corollary 3.1 guarantee (negative targets are then likely; they are clamped and recorded).

    Use
    ---
    ``update(values)`` once per step with one value per user (length n, fixed by the first call),
    or ``release_counts(counts)`` once per update step with the window histogram C^t (length A^k,
    pattern code Σ_i x^{t−k+1+i}·A^{k−1−i}, oldest value most significant) — the streaming path
    where workers count and the releaser only sees counts. The two paths give bit-for-bit the same
    output for the same seed; one synthesizer uses one path.

    Both return the newly released synthetic columns as an int array of shape (m, j): an empty
    (0, 0) array before step k (nothing is released yet: m is not known), the first k columns at
    t = k, then one column per step.
    """

    def __init__(
        self,
        horizon: int,
        window: int,
        rho: float,
        beta: float = 0.05,
        categories: int = 2,
        neighbours: str = "add_remove",
        seed: RandomSource | int | None = None,
        *,
        n: int | None = None,
        n_pad: int | None = None,
    ):
        self.horizon = check_int(horizon, "horizon", low=1)
        self.window = check_int(window, "window", low=1)
        if self.window > self.horizon:
            raise ValueError(
                f"window must be <= horizon, got window={self.window} > horizon={self.horizon}"
            )
        self.rho = check_rho(rho)
        self.beta = check_beta(beta)
        self.categories = check_int(categories, "categories", low=2)
        if self.categories**self.window > MAX_BINS:
            raise ValueError(
                f"categories**window = {self.categories}**{self.window} bins exceeds the limit of {MAX_BINS}; "
                "use a smaller window or alphabet"
            )
        self.neighbours = check_neighbours(neighbours)
        self.n = None if n is None else check_int(n, "n", low=1)
        self._rng = as_random_source(seed)

        self.n_bins = self.categories**self.window
        self.n_groups = self.categories ** (self.window - 1)
        self.update_steps = self.horizon - self.window + 1  # R
        self.sensitivity_factor = sensitivity_factor(self.neighbours)
        self.sigma2 = self.sensitivity_factor * self.update_steps / (2.0 * self.rho)
        self.rounding_constant = rounding_constant(self.categories, self.sigma2)
        self.padding_overridden = n_pad is not None
        if n_pad is None:
            self.n_pad = int(
                math.ceil(
                    self._bound_factor()
                    * math.sqrt(math.log(self.n_bins * self.update_steps / self.beta))
                )
            )
        else:
            self.n_pad = check_int(n_pad, "n_pad", low=0)

        self.t = 0
        self.m: int | None = None
        self._mode: str | None = None  # "values" or "counts"
        self._user_codes: np.ndarray | None = None  # curator-side: last k−1 real values per user
        self._syn: np.ndarray | None = None  # (m, T) synthetic values, columns filled up to t
        self._syn_codes: np.ndarray | None = None  # each record's current window code (public)
        self._steps: list[int] = []
        self._noisy: list[np.ndarray] = []
        self._projected: list[np.ndarray] = []
        self._clamped: list[int] = []

    # ---------------------------------------------------------------------------------------
    # public numbers
    # ---------------------------------------------------------------------------------------
    def _bound_factor(self) -> float:
        return math.sqrt(2.0 * self.sigma2) + self.rounding_constant

    @property
    def accuracy_bound(self) -> float:
        """λ of Theorem 3.2 (two-sided, generalised): (√(2σ²) + c_A)·√ln(2·A^k·R/β)."""
        return self._bound_factor() * math.sqrt(
            math.log(2.0 * self.n_bins * self.update_steps / self.beta)
        )

    @property
    def rho_per_step(self) -> float:
        return self.rho / self.update_steps

    @property
    def synthetic(self) -> np.ndarray:
        """The synthetic records released so far, shape (m, columns released); read-only view."""
        if self._syn is None:
            return np.zeros((0, 0), dtype=synthetic_dtype(self.categories))
        view = self._syn[:, : self.t]
        view.flags.writeable = False
        return view

    @property
    def noisy_counts(self) -> dict[int, np.ndarray]:
        """Ĉ^t per update step t (padding included; public)."""
        return {t: a.copy() for t, a in zip(self._steps, self._noisy)}

    @property
    def projected_counts(self) -> dict[int, np.ndarray]:
        """p^t per update step t: synthetic records per window pattern (public)."""
        return {t: a.copy() for t, a in zip(self._steps, self._projected)}

    @property
    def clamped_bins(self) -> dict[int, int]:
        """Per update step, the number of bins whose projected target left [0, |I_z|] and was clamped."""
        return dict(zip(self._steps, self._clamped))

    @property
    def clamp_count(self) -> int:
        return int(sum(self._clamped))

    @property
    def secure(self) -> bool:
        return bool(self._rng.secure)

    def parameters(self) -> dict[str, Any]:
        """Public parameters for a release manifest."""
        return {
            "mechanism": "fixed_window",
            "horizon": self.horizon,
            "window": self.window,
            "categories": self.categories,
            "rho": self.rho,
            "rho_per_step": self.rho_per_step,
            "beta": self.beta,
            "neighbours": self.neighbours,
            "sigma2": self.sigma2,
            "n_pad": self.n_pad,
            "n_pad_overridden": self.padding_overridden,
            "accuracy_bound": self.accuracy_bound,
            "m": self.m,
        }

    # ---------------------------------------------------------------------------------------
    # stepping
    # ---------------------------------------------------------------------------------------
    def _empty(self) -> np.ndarray:
        return np.zeros((0, 0), dtype=synthetic_dtype(self.categories))

    def _set_mode(self, mode: str) -> None:
        if self._mode is None:
            self._mode = mode
        elif self._mode != mode:
            raise RuntimeError(
                f"this synthesizer is driven by {self._mode}; do not mix update() and release_counts()"
            )

    def update(self, values) -> np.ndarray:
        """Consume one step of reports (one value per user) and release what is due."""
        if self.t >= self.horizon:
            raise RuntimeError(f"horizon reached: all {self.horizon} steps were already consumed")
        x = coerce_values(values, self.categories, self.n, "values")
        self._set_mode("values")
        if self.n is None:
            self.n = int(x.size)
        if self._user_codes is None:
            self._user_codes = np.zeros(self.n, dtype=np.int64)
        window_codes = self._user_codes * self.categories + x  # last min(t+1, k) values
        self._user_codes = window_codes % self.n_groups
        if self.t + 1 < self.window:
            self.t += 1
            return self._empty()
        counts = np.bincount(window_codes, minlength=self.n_bins).astype(np.int64)
        return self._release(counts, self.t + 1)

    def release_counts(self, counts) -> np.ndarray:
        """Release the next update step from its window histogram C^t (length A^k).

        The first call releases step k (the first k columns); each later call one more step.
        """
        step = max(self.t + 1, self.window)
        if step > self.horizon:
            raise RuntimeError(f"horizon reached: all {self.horizon} steps were already consumed")
        c = coerce_counts(counts, self.n_bins, "counts")
        total = int(c.sum())
        if self.n is not None and total != self.n:
            raise ValueError(f"counts sum to {total} but the synthesizer has n={self.n} users")
        self._set_mode("counts")
        if self.n is None:
            self.n = total
        return self._release(c, step)

    def _release(self, counts: np.ndarray, step: int) -> np.ndarray:
        a, k = self.categories, self.window
        noise = _discrete_gaussian(self.sigma2, self.n_bins, self._rng)
        noisy = counts + self.n_pad + noise
        if step == k:
            projected = np.maximum(noisy, 0)
            clamped = int((noisy < 0).sum())
            self.m = int(projected.sum())
            # the m records take the k-length patterns in a uniformly random order: one group
            codes = assign_groups(np.zeros(self.m, dtype=np.int64), projected[None, :], self._rng)
            self._syn = np.zeros((self.m, self.horizon), dtype=synthetic_dtype(a))
            for i in range(k):
                self._syn[:, i] = (codes // a ** (k - 1 - i)) % a
            self._syn_codes = codes
            new_cols = slice(0, k)
        else:
            assert self._syn is not None and self._syn_codes is not None  # allocated at step k
            prev = self._projected[-1]
            parents = prev.reshape(a, self.n_groups).sum(axis=0)  # P_z = Σ_c p^{t−1}_{cz}
            target = project_children(parents, noisy.reshape(self.n_groups, a), self._rng)
            children, clamped = clamp_children(target, parents)
            group = self._syn_codes % self.n_groups  # synthetic records' last k−1 synthetic values
            labels = assign_groups(group, children, self._rng)
            self._syn[:, step - 1] = labels
            self._syn_codes = group * a + labels
            projected = children.reshape(-1)
            new_cols = slice(step - 1, step)
        self.t = step
        self._steps.append(step)
        self._noisy.append(noisy)
        self._projected.append(projected)
        self._clamped.append(clamped)
        return self._syn[:, new_cols].copy()

    # ---------------------------------------------------------------------------------------
    # checkpoint / restore
    # ---------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (curator-side: holds users' last k−1 values)."""
        nb = self.n_bins
        return {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "params": {
                "horizon": self.horizon,
                "window": self.window,
                "rho": self.rho,
                "beta": self.beta,
                "categories": self.categories,
                "neighbours": self.neighbours,
                "n": self.n,
                "n_pad": self.n_pad if self.padding_overridden else None,
            },
            "n_pad": self.n_pad,
            "t": self.t,
            "m": self.m,
            "mode": self._mode,
            "user_codes": self._user_codes,
            "synthetic": None if self._syn is None else self._syn[:, : self.t].copy(),
            "syn_codes": self._syn_codes,
            "steps": np.asarray(self._steps, dtype=np.int64),
            "noisy": np.asarray(self._noisy, dtype=np.int64).reshape(-1, nb),
            "projected": np.asarray(self._projected, dtype=np.int64).reshape(-1, nb),
            "clamped": np.asarray(self._clamped, dtype=np.int64),
            "rng": self._rng.get_state(),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], rng: RandomSource | None = None
    ) -> FixedWindowSynthesizer:
        """Rebuild from :meth:`get_state`. A secure source resumes with fresh OS randomness; noise
        already drawn is part of the state and never redrawn."""
        if state.get("kind") != _STATE_KIND:
            raise ValueError(f"not a {_STATE_KIND} state (kind={state.get('kind')!r})")
        p = state["params"]
        source = rng if rng is not None else random_source_from_state(state["rng"])
        obj = cls(
            p["horizon"],
            p["window"],
            p["rho"],
            p["beta"],
            p["categories"],
            p["neighbours"],
            source,
            n=p["n"],
            n_pad=p["n_pad"],
        )
        if obj.n_pad != int(state["n_pad"]):
            raise ValueError("state n_pad does not match the recomputed padding")
        obj.t = int(state["t"])
        obj.m = None if state["m"] is None else int(state["m"])
        obj._mode = state["mode"]
        obj._user_codes = (
            None
            if state["user_codes"] is None
            else np.asarray(state["user_codes"], dtype=np.int64).copy()
        )
        if state["synthetic"] is not None:
            syn = np.asarray(state["synthetic"])
            obj._syn = np.zeros((syn.shape[0], obj.horizon), dtype=synthetic_dtype(obj.categories))
            obj._syn[:, : syn.shape[1]] = syn
        obj._syn_codes = (
            None
            if state["syn_codes"] is None
            else np.asarray(state["syn_codes"], dtype=np.int64).copy()
        )
        obj._steps = [int(s) for s in np.asarray(state["steps"])]
        obj._noisy = [np.asarray(r, dtype=np.int64).copy() for r in np.asarray(state["noisy"])]
        obj._projected = [
            np.asarray(r, dtype=np.int64).copy() for r in np.asarray(state["projected"])
        ]
        obj._clamped = [int(c) for c in np.asarray(state["clamped"])]
        return obj

    def __repr__(self) -> str:
        return (
            f"FixedWindowSynthesizer(horizon={self.horizon}, window={self.window}, rho={self.rho}, "
            f"categories={self.categories}, neighbours={self.neighbours!r}, n_pad={self.n_pad}, t={self.t}, m={self.m})"
        )
