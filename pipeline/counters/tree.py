"""Binary tree mechanism (tree-based aggregation): a ρ-zCDP continual counter.

Bun, Gaboardi, Neunhoeffer & Zhang 2024, Appendix A, Algorithm 3 (after Dwork, Naor, Pitassi &
Rothblum 2010 and Chan, Shi & Song 2011), with discrete Gaussian noise (Canonne, Kamath & Steinke 2020).

Algorithm. At step t with i = lowest set bit of t, the dyadic node [t − 2^i + 1, t] closes:
α_i ← Σ_{j<i} α_j + z_t (the lower nodes it absorbs are reset), its noisy value
α̃_i ← α_i + N_Z(0, σ²) is drawn **once**, and the output is S̃_t = Σ_{j: bit j of t is 1} α̃_j,
a sum of popcount(t) released nodes. Only nodes that have closed are ever used, so S̃_t never
depends on later increments.

Calibration (why not the paper's σ² = log T/(2ρ)). One node is released per step: at step t the
node of level i = lowest set bit of t. So the released level-i nodes are [(k−1)2^i + 1, k·2^i] with
k odd and k·2^i ≤ T (a node with k even closes together with its parent and is absorbed by it).
A leaf lies in at most one node per level and levels with 2^i > T release nothing, so a leaf lies
in at most L = ⌊log2 T⌋ + 1 released nodes; leaf 1 lies in exactly L ([1,1], [1,2], [1,4], …,
[1,2^{L−1}]). For T = 8 that is 4 nodes while log2 8 = 3, and for T = 12 it is 4 while
log2 12 ≈ 3.58, so log T/(2ρ) is not ρ-zCDP for every T.

Each released node is a count plus noise of variance parameter σ²; a node whose true value changes
by c costs c²/(2σ²) zCDP (Bun & Steinke 2016, Prop. 1.6; CKS 2020 prove the same for the discrete
Gaussian), and zCDP composes additively, so the whole tree costs (Σ_nodes c_node²)/(2σ²):

* ``add_remove`` (one increment changes by at most 1, the seed's neighbouring streams):
  Σ c² ≤ L, hence σ² = L/(2ρ) and every node costs ρ/L.
* ``replace`` (one user replaced: in the cumulative synthesizer a user's +1 moves from one leaf
  to another, i.e. one leaf −1 and one leaf +1): nodes holding both leaves do not change, the
  others change by 1, so Σ c² ≤ 2L, hence σ² = 2L/(2ρ) = L/ρ (the factor
  :func:`pipeline.privacy.neighbours.sensitivity_factor` gives) and a node with c = 1 costs ρ/(2L).
  2L is an upper bound; the exact maximum over pairs of leaves can be a little lower.

Error. S̃_t − S_t is the sum of popcount(t) independent N_Z(0, σ²) draws, with variance
popcount(t)·Var(N_Z(0, σ²)) ≤ popcount(t)·σ² (CKS 2020: the discrete Gaussian's variance is below
σ², and only negligibly so once σ² ≳ 1) — :meth:`TreeCounter.variance_at`.

State. The node arrays α and α̃ and the step t are the whole state; noise is stored inside α̃ when
its node closes, so restoring a checkpoint never redraws released noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.privacy import noise as _noise  # module reference: tests may swap the sampler
from pipeline.privacy.neighbours import check_neighbours, sensitivity_factor
from pipeline.privacy.rng import RandomSource, as_random_source, restore_random_source
from pipeline.validation import check_int, check_rho

__all__ = [
    "HorizonExceededError",
    "TreeCounter",
    "tree_levels",
    "tree_sigma2",
    "released_nodes",
]

_STATE_KIND = "tree_counter"
_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min
# Below this magnitude a sum of at most 64 terms cannot overflow int64: skip the exact check.
_FAST_BOUND = 2**56


class HorizonExceededError(ValueError):
    """``update`` was called after the counter's last step."""


def tree_levels(horizon: int) -> int:
    """L = ⌊log2 T⌋ + 1: the most released nodes any leaf belongs to (= number of tree levels used)."""
    return check_int(horizon, "horizon", low=1).bit_length()


def tree_sigma2(horizon: int, rho: float, neighbours: str = "add_remove") -> float:
    """Per-node σ² making the counter ρ-zCDP: σ² = factor·L/(2ρ), factor 1 (add_remove) or 2 (replace)."""
    return (
        sensitivity_factor(check_neighbours(neighbours))
        * tree_levels(horizon)
        / (2.0 * check_rho(rho))
    )


def released_nodes(horizon: int) -> list[tuple[int, int, int]]:
    """All nodes released over ``horizon`` steps as (level, first leaf, last leaf = closing step)."""
    horizon = check_int(horizon, "horizon", low=1)
    out = []
    for t in range(1, horizon + 1):
        i = (t & -t).bit_length() - 1
        out.append((i, t - (1 << i) + 1, t))
    return out


class TreeCounter:
    """ρ-zCDP continual counter over steps 1..``horizon`` (Bun et al. 2024, Algorithm 3).

    ``seed``: None (secure OS randomness), an int (seeded, tests/simulation only) or a shared
    :class:`~pipeline.privacy.rng.RandomSource`; resolved once and kept.
    ``width``: None for one counter (``update`` takes and returns an int), or k for k independent
    counters sharing horizon and ρ (``update`` takes and returns int64 arrays of shape (k,)). Each
    of the k counters is ρ-zCDP with respect to its own stream; if one user can touch several of
    them, the caller composes.

    Attributes: ``horizon``, ``rho``, ``neighbours``, ``levels`` (L), ``sigma2`` (per-node σ²),
    ``node_rho`` (zCDP cost of one node whose value changes by 1: 1/(2σ²) = ρ/L for add_remove,
    ρ/(2L) for replace), ``t`` (steps consumed), ``rng``.
    """

    def __init__(
        self,
        horizon: int,
        rho: float,
        seed: RandomSource | int | None = None,
        neighbours: str = "add_remove",
        width: int | None = None,
    ):
        self.horizon = check_int(horizon, "horizon", low=1)
        self.rho = check_rho(rho)
        self.neighbours = check_neighbours(neighbours)
        if width is not None:
            if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
                raise ValueError(f"width must be None or an int >= 1, got {width!r}")
            width = int(width)
        self.width = width
        self.rng = as_random_source(seed)
        self.levels = self.horizon.bit_length()
        self.sigma2 = tree_sigma2(self.horizon, self.rho, self.neighbours)
        self.node_rho = 1.0 / (2.0 * self.sigma2)
        try:  # fail at construction, not at the first update, if the sampler cannot use this σ²
            _noise.exact_sigma2(self.sigma2)
        except ValueError as exc:
            raise ValueError(
                f"rho={self.rho} with horizon={self.horizon} gives per-node sigma2="
                f"{self.sigma2!r}, outside the sampler's range: {exc}"
            ) from None
        self._n = 1 if width is None else width
        shape = (self.levels, self._n)  # one column per counter (a single counter: one column)
        self._alpha = np.zeros(shape, dtype=np.int64)  # true node sums α
        self._alpha_noisy = np.zeros(shape, dtype=np.int64)  # released node values α̃
        self.t = 0

    # -- the mechanism ----------------------------------------------------------------------
    def update(self, z):
        """Consume the increment of step t = self.t + 1 and return the noisy prefix sum S̃_t."""
        if self.t >= self.horizon:
            raise HorizonExceededError(
                f"update for step {self.t + 1} refused: the counter's horizon is {self.horizon}"
            )
        z = self._check_z(z)
        t = self.t + 1
        i = (t & -t).bit_length() - 1
        # node [t−2^i+1, t] absorbs the nodes j < i, which cover exactly its other leaves
        node = self._sum_int64(np.vstack([self._alpha[:i], z[None, :]]), "node sum")
        noisy = self._sum_int64(np.vstack([node, self._discrete_gaussian(self._n)]), "noisy node")
        # commit only after everything that can fail has succeeded
        self._alpha[:i] = 0
        self._alpha_noisy[:i] = 0
        self._alpha[i] = node
        self._alpha_noisy[i] = noisy
        self.t = t
        return self._prefix(t)

    def _discrete_gaussian(self, n: int) -> np.ndarray:
        return np.asarray(
            _noise.discrete_gaussian(self.sigma2, n, rng=self.rng), dtype=np.int64
        ).reshape(n)

    def _prefix(self, t: int):
        bits = [j for j in range(self.levels) if (t >> j) & 1]
        total = self._sum_int64(self._alpha_noisy[bits], "prefix sum")
        return int(total[0]) if self.width is None else total

    def _check_z(self, z):
        if self.width is None:
            if isinstance(z, (bool, np.bool_)) or not isinstance(z, (int, np.integer)):
                raise TypeError(f"z must be an int, got {type(z).__name__}")
            if not (_INT64_MIN <= int(z) <= _INT64_MAX):
                raise ValueError(f"z={z} does not fit in int64")
            return np.array([int(z)], dtype=np.int64)
        arr = np.asarray(z)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"z must be an integer array, got dtype {arr.dtype}")
        if arr.shape != (self.width,):
            raise ValueError(f"z must have shape ({self.width},), got {arr.shape}")
        if arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:
            raise ValueError("z has values that do not fit in int64")
        return arr.astype(np.int64)

    @staticmethod
    def _sum_int64(rows: np.ndarray, what: str):
        """Σ over axis 0 in int64, refusing (not wrapping) on overflow."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros(rows.shape[1:], dtype=np.int64)
        # (not np.abs: it maps INT64_MIN to itself)
        if rows.shape[0] <= 64 and rows.max() < _FAST_BOUND and rows.min() > -_FAST_BOUND:
            return rows.sum(axis=0)
        exact = rows.astype(object).sum(axis=0)
        big = np.asarray(exact, dtype=object)
        if np.any((big > _INT64_MAX) | (big < _INT64_MIN)):
            raise OverflowError(f"{what} overflows int64")
        return np.asarray(exact, dtype=np.int64)

    # -- reading ----------------------------------------------------------------------------
    @property
    def realised_rho(self) -> float:
        """Δ²/(2σ²) from the σ² the node draws use: a leaf lies in at most L released nodes, so
        Δ² = L (add/remove) or 2L (replace) (module docstring)."""
        return sensitivity_factor(self.neighbours) * self.levels / (2.0 * self.sigma2)

    def variance_at(self, t: int) -> float:
        """popcount(t)·σ²: variance of S̃_t − S_t for the continuous Gaussian and an upper bound for
        the discrete one used here (whose variance is < σ²)."""
        if (
            isinstance(t, bool)
            or not isinstance(t, (int, np.integer))
            or not 1 <= t <= self.horizon
        ):
            raise ValueError(f"t must be an int in [1, {self.horizon}], got {t!r}")
        return bin(int(t)).count("1") * self.sigma2

    @property
    def value(self):
        """S̃ of the last step consumed (None before the first update)."""
        return None if self.t == 0 else self._prefix(self.t)

    # -- state ------------------------------------------------------------------------------
    def get_state(self, include_rng: bool = True) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (see :mod:`pipeline.serialization`).

        With a RandomSource shared by several mechanisms, pass ``include_rng=False`` and
        checkpoint the shared source once; then give it to :meth:`from_state`.
        """
        return {
            "kind": _STATE_KIND,
            "horizon": self.horizon,
            "rho": self.rho,
            "neighbours": self.neighbours,
            "width": self.width,
            "sigma2": self.sigma2,
            "t": self.t,
            "alpha": self._alpha.copy(),
            "alpha_noisy": self._alpha_noisy.copy(),
            "rng": self.rng.get_state() if include_rng else None,
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], rng: RandomSource | int | None = None
    ) -> TreeCounter:
        """Restore a counter from :meth:`get_state`. ``rng``, if given, replaces the stored source
        (needed when the state was taken with ``include_rng=False``)."""
        rng = restore_random_source(state, _STATE_KIND, rng, what="tree counter")
        c = cls(
            state["horizon"],
            state["rho"],
            seed=rng,
            neighbours=state["neighbours"],
            width=state["width"],
        )
        # Released noise was calibrated with the stored σ²; refuse to continue under another
        # calibration rather than mix two noise scales in one tree.
        if c.sigma2 != state["sigma2"]:
            raise ValueError(
                f"stored sigma2={state['sigma2']!r} differs from this version's {c.sigma2!r}"
            )
        t = int(state["t"])
        if not 0 <= t <= c.horizon:
            raise ValueError(f"stored t={t} is outside [0, {c.horizon}]")
        for name in ("alpha", "alpha_noisy"):
            arr = np.asarray(state[name])
            if arr.shape != c._alpha.shape or arr.dtype != np.int64:
                raise ValueError(
                    f"stored {name} has shape {arr.shape} dtype {arr.dtype}, "
                    f"expected {c._alpha.shape} int64"
                )
        c._alpha = np.array(state["alpha"], dtype=np.int64)
        c._alpha_noisy = np.array(state["alpha_noisy"], dtype=np.int64)
        c.t = t
        return c

    def __repr__(self) -> str:
        return (
            f"TreeCounter(horizon={self.horizon}, rho={self.rho}, neighbours={self.neighbours!r}, "
            f"width={self.width}, t={self.t})"
        )
